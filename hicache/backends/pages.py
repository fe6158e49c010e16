"""PageIO: the bytes of one host-pool page, one object per part, for storage backends.

A page's object for part ``p`` (K, V or the MLA latent) is the ``page_size * layer_num *
item_size`` bytes of that page in the host layout's own order. In ``page_first``,
``page_first_direct`` and ``page_head`` those bytes are contiguous in the pool, so ``source``
and ``target`` are zero-copy views (``zero_copy``) and ``address`` gives their pointers; in
``layer_first`` a page is strided across layers, so ``source`` gathers a copy and ``target``
hands out a staging array that ``commit`` scatters into the pool.

The layout is part of the storage fingerprint (``keys.KVFingerprint``), so objects written
from one layout are never read into another.

Integrity (``page_sum``): every object a backend stores is its payload and a trailer
(``stored_bytes`` in all). ``trailer`` makes it at a write, carrying the page checksum the host
tier recorded at its backup (``attach_checksums``; ``NO_SUM`` without one); ``accept`` checks a
read page's objects against their trailers before the backend commits or reports the page and
hands the checksum they carry to the host tier's store.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hicache.backends.keys import check_keys
from hicache.backends.page_sum import check_trailer, make_trailer, sums_of, trailer_bytes
from hicache.checks import check_index_tensor
from hicache.kernels.checksum import NO_SUM

__all__ = ["PageIO"]


class PageIO:
    """Page objects of ``host_pool`` (a ``HostKVPool``); see the module docstring.

    Attributes
    ----------
    parts : objects per page (2 for MHA, 1 for MLA).
    page_size : tokens per page.
    object_bytes : bytes of one object.
    zero_copy : whether objects are views into the pool (every layout but ``layer_first``).
    trailer_bytes, stored_bytes : bytes of an object's trailer, and of a whole stored object.
    """

    host_pool: Any

    def __init__(self, host_pool: Any) -> None:
        ps, layers = host_pool.page_size, host_pool.layer_num
        self.host_pool = host_pool
        self._frame(host_pool.parts, ps * layers * host_pool.item_size, ps, host_pool.layout)
        self._size(host_pool.size, layers)
        self.zero_copy = host_pool.layout != "layer_first"
        self._parts: list[torch.Tensor] = list(host_pool.host_parts)
        self._flat = [_bytes(t) for t in self._parts] if self.zero_copy else []

    def _frame(self, parts: int, object_bytes: int, page_size: int, layout: str) -> None:
        """The page shape: ``parts`` objects of ``object_bytes`` per page of ``page_size``
        slots, from a pool of ``layout`` (not zero-copy until a subclass says so)."""
        self.parts, self.object_bytes, self.zero_copy = parts, object_bytes, False
        self.page_size, self.layout = page_size, layout

    def _size(self, slot_limit: int, sum_layers: int) -> None:
        """Pages lie in host slots ``[0, slot_limit)``; a trailer carries ``sum_layers``
        checksums (``NO_SUM`` unless ``attach_checksums``)."""
        self.slot_limit = slot_limit
        self.trailer_bytes = trailer_bytes(sum_layers)
        self.stored_bytes = self.object_bytes + self.trailer_bytes
        self._no_sum = np.full(sum_layers, NO_SUM, np.int64)
        self._sums: np.ndarray | None = None

    def attach_checksums(self, store: torch.Tensor) -> None:
        """Carry the host tier's page checksums (int64 CPU ``[host pages, layers]``, indexed by
        host page; ``controller.integrity.PageIntegrity.store``): a write's trailer takes the
        page's row, a verified read writes it."""
        if store.dtype != torch.int64 or store.dim() != 2 or not store.is_cpu:
            raise ValueError(f"store must be an int64 CPU tensor [pages, layers], got {store}")
        if tuple(store.shape) != (self.slot_limit // self.page_size, len(self._no_sum)):
            raise ValueError(f"store must have one row per host page, got {tuple(store.shape)}")
        self._sums = store.numpy()

    def forget(self, host_indices: torch.Tensor) -> None:
        """Mark the pages of ``host_indices`` (whole pages, checked by the caller) as having no
        checksum before a read fills them: a backend that does not ``accept`` its pages (one of
        the user's) leaves them unchecked at load-back rather than checked against a stale row."""
        if self._sums is not None and host_indices.numel():
            self._sums[host_indices[:: self.page_size].numpy() // self.page_size] = NO_SUM

    def trailer(self, name: str, slot: int, payload: np.ndarray) -> bytes:
        """The trailer of object ``name`` of the page at ``slot`` (``payload``: its bytes, from
        ``source(slot)``)."""
        sums = self._no_sum if self._sums is None else self._sums[slot // self.page_size]
        return make_trailer(name, payload, sums)

    def accept(self, names: list[str], slot: int, payloads: list[Any], trailers: list[Any]) -> bool:
        """Whether the objects ``names`` read for the page at ``slot`` (``payloads``: the
        filled ``target`` arrays; ``trailers``: the trailer read with each) are intact and
        agree on the page checksum; if so, that checksum goes to the host tier's store."""
        sums = [check_trailer(n, p, t) for n, p, t in zip(names, payloads, trailers, strict=True)]
        if sums[0] is None or sums.count(sums[0]) != len(sums):
            return False
        if self._sums is not None:
            self._sums[slot // self.page_size] = sums_of(sums[0])
        return True

    def regions(self) -> list[tuple[int, int]]:
        """``(address, bytes)`` of each part's whole buffer (to register with a store)."""
        return [(t.data_ptr(), t.numel() * t.element_size()) for t in self._parts]

    def page_slots(self, keys: list[str], host_indices: Any) -> list[int]:
        """The first host slot of each page of a batch call, checked.

        ``TypeError`` unless ``keys`` is a list of str and ``host_indices`` a 1-D int64 CPU
        tensor; ``ValueError`` for a malformed key (``keys.check_keys``), unless ``host_indices``
        has ``len(keys) * page_size`` slots, each page's slots consecutive from a multiple of
        ``page_size``; ``IndexError`` past the pool.
        """
        check_keys(keys)
        check_index_tensor("host_indices", host_indices)
        if host_indices.device.type != "cpu":
            raise ValueError(f"host_indices must be on the CPU, got {host_indices.device}")
        ps = self.page_size
        if host_indices.numel() != len(keys) * ps:
            raise ValueError(
                f"host_indices must hold len(keys) * page_size = {len(keys) * ps} slots, "
                f"got {host_indices.numel()}"
            )
        if not keys:
            return []
        pages = host_indices.reshape(len(keys), ps).numpy()
        firsts = pages[:, 0]
        if (firsts % ps).any() or (pages != firsts[:, None] + np.arange(ps)).any():
            raise ValueError("host_indices must be whole pages: page_size consecutive slots each")
        if firsts.min() < 0 or firsts.max() + ps > self.slot_limit:
            raise IndexError(f"host_indices must lie in [0, {self.slot_limit})")
        return [int(s) for s in firsts]

    def _view(self, part: int, slot: int) -> torch.Tensor:
        buf = self._parts[part]
        if self.layout == "layer_first":  # [layers, size, heads, dim]
            return buf[:, slot : slot + self.page_size]
        if self.layout == "page_first":  # [size, layers, heads, dim]
            return buf[slot : slot + self.page_size]
        return buf[slot // self.page_size]  # [pages, ...]: page_first_direct, page_head

    def _objects(self, slot: int) -> list[np.ndarray]:
        """The page's objects in the pool (``zero_copy`` layouts): in every one of them, a
        page's bytes are one run at ``slot * object_bytes / page_size`` of its part's buffer."""
        start = slot // self.page_size * self.object_bytes
        return [flat[start : start + self.object_bytes] for flat in self._flat]

    def source(self, slot: int) -> list[np.ndarray]:
        """The page at ``slot``'s objects as 1-D uint8 arrays (views when ``zero_copy``, else
        copies); read them, never write them."""
        if self.zero_copy:
            return self._objects(slot)
        return [_bytes(self._view(p, slot).contiguous()) for p in range(self.parts)]

    def target(self, slot: int) -> list[np.ndarray]:
        """Writable 1-D uint8 arrays to fill with the page's objects: views into the pool when
        ``zero_copy`` (written in place), else staging arrays that ``commit`` copies in."""
        if self.zero_copy:
            return self._objects(slot)
        return [np.empty(self.object_bytes, np.uint8) for _ in range(self.parts)]

    def commit(self, slot: int, filled: list[np.ndarray]) -> None:
        """Copy staging arrays from ``target`` into the pool (a no-op when ``zero_copy``)."""
        if self.zero_copy:
            return
        for p, arr in enumerate(filled):
            view = self._view(p, slot)
            view.copy_(torch.from_numpy(arr).view(view.dtype).view(view.shape))

    def address(self, slot: int) -> list[int]:
        """The pool addresses of the page's objects (``zero_copy`` layouts only)."""
        assert self.zero_copy, "address() needs a zero-copy layout"
        return [int(obj.ctypes.data) for obj in self._objects(slot)]


def _bytes(t: torch.Tensor) -> np.ndarray:
    assert t.is_contiguous()
    return t.reshape(-1).view(torch.uint8).numpy()
