"""PageIO: the bytes of one host-pool page, one object per part, for storage backends.

A page's object for part ``p`` (K, V or the MLA latent) is the ``page_size * layer_num *
item_size`` bytes of that page in the host layout's own order. In ``page_first``,
``page_first_direct`` and ``page_head`` those bytes are contiguous in the pool, so ``source``
and ``target`` are zero-copy views (``zero_copy``) and ``address`` gives their pointers; in
``layer_first`` a page is strided across layers, so ``source`` gathers a copy and ``target``
hands out a staging array that ``commit`` scatters into the pool.

The layout is part of the storage fingerprint (``keys.KVFingerprint``), so objects written
from one layout are never read into another.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hicache.backends.keys import check_keys
from hicache.checks import check_index_tensor

__all__ = ["PageIO"]


class PageIO:
    """Page objects of ``host_pool`` (a ``HostKVPool``); see the module docstring.

    Attributes
    ----------
    parts : objects per page (2 for MHA, 1 for MLA).
    page_size : tokens per page.
    object_bytes : bytes of one object.
    zero_copy : whether objects are views into the pool (every layout but ``layer_first``).
    """

    def __init__(self, host_pool: Any) -> None:
        self.host_pool = host_pool
        self.parts: int = host_pool.parts
        self.page_size: int = host_pool.page_size
        self.layout: str = host_pool.layout
        self.object_bytes: int = self.page_size * host_pool.layer_num * host_pool.item_size
        self.zero_copy = self.layout != "layer_first"
        self._parts: list[torch.Tensor] = list(host_pool.host_parts)

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
        if firsts.min() < 0 or firsts.max() + ps > self.host_pool.size:
            raise IndexError(f"host_indices must lie in [0, {self.host_pool.size})")
        return [int(s) for s in firsts]

    def _view(self, part: int, slot: int) -> torch.Tensor:
        buf = self._parts[part]
        if self.layout == "layer_first":  # [layers, size, heads, dim]
            return buf[:, slot : slot + self.page_size]
        if self.layout == "page_first":  # [size, layers, heads, dim]
            return buf[slot : slot + self.page_size]
        return buf[slot // self.page_size]  # [pages, ...]: page_first_direct, page_head

    def source(self, slot: int) -> list[np.ndarray]:
        """The page at ``slot``'s objects as 1-D uint8 arrays (views when ``zero_copy``, else
        copies); read them, never write them."""
        return [_bytes(self._view(p, slot).contiguous()) for p in range(self.parts)]

    def target(self, slot: int) -> list[np.ndarray]:
        """Writable 1-D uint8 arrays to fill with the page's objects: views into the pool when
        ``zero_copy`` (written in place), else staging arrays that ``commit`` copies in."""
        if self.zero_copy:
            return [_bytes(self._view(p, slot)) for p in range(self.parts)]
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
        return [self._view(p, slot).data_ptr() for p in range(self.parts)]


def _bytes(t: torch.Tensor) -> np.ndarray:
    assert t.is_contiguous()
    return t.reshape(-1).view(torch.uint8).numpy()
