"""Page integrity of the host tier: checksums taken at backup, checked on the GPU at load-back.

Modes (``verify``): ``"off"`` (nothing computed, nothing checked: a corrupt host page is served),
``"sample"`` (every backup is checksummed; one load-back in ``sample_period`` is verified, the
first, the ``period + 1``-th, ... — deterministic), ``"all"`` (every load-back is verified).

Store: :class:`PageIntegrity` owns one int64 tensor ``[host pages, layers]``, indexed by host page
(``host slot // page_size``), in host memory (pinned when the device pool is on CUDA, so the
checksum kernel reads and writes it directly: no device memory, no CPU work per page). Entries
of a free host page are stale and never read: the backup that fills a page overwrites its
entries, on the write stream right after the copy, and a page is loaded only from a node whose
backup ack has been processed (a node being written is locked on the device).

A hybrid model's pools (a composite device pool, a ``HybridKVPoolHost``): the store has the host
pool's ``layer_num`` columns, one block per inner pool (its layers in its own order; the full one
first), each checksummed over that pool's slots of the transfer (``inner_slots``: the SWA pool's
through its mapping). A page holding a token without an SWA slot (tombstoned: it maps to 0, the
padding slot) records ``NO_SUM`` for its SWA layers at backup and is not checked there at a load
that maps a token to 0: its SWA bytes are the padding slot's, which the tree never serves. The
full layers of every page, and the SWA layers of a live page, are checked. A page corrupt in
both blocks counts once per block in ``failures``.

Checksums (:mod:`hicache.kernels.checksum`) are taken over the device copy at both ends: the
source of the backup and the destination of the load. A page of a transfer is ``page_size``
consecutive entries of its (host, device) index pairs, in the order the tree stores them; its
host page is that of its first host slot.

Cost: at backup, one kernel on the write stream reading the backed-up KV once from device memory
(``RECORD_PROGRAMS`` programs, so it leaves most SMs to the model). At a verified load-back, one
kernel on the load stream after the last layer has landed, and one device-to-host read of two
integers: the CPU blocks until the load has landed, so the forward pass of that load no longer
overlaps its transfer (``benchmarks/bench_verify.py`` measures both).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hicache.devices import is_cuda, pin_tensor, unpin_tensor
from hicache.kernels.checksum import NO_SUM, record_page_checksums, verify_page_checksums
from hicache.pools import DevicePool, HostKVPool, HostPool, HybridKVPoolHost, KVPool

VERIFY_MODES = ("off", "sample", "all")
RECORD_PROGRAMS = 256  # backups overlap the model: a bounded grid (about 1/4 of an H200's warps)
VERIFY_PROGRAMS = 1024  # a verified load blocks the CPU: the whole GPU


def check_verify(verify: object, sample_period: object) -> None:
    """``ValueError`` naming ``verify`` unless it is one of :data:`VERIFY_MODES`;
    ``TypeError``/``ValueError`` naming ``verify_sample_period`` unless it is an int >= 1."""
    if not isinstance(verify, str) or verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
    if isinstance(sample_period, bool) or not isinstance(sample_period, int):
        raise TypeError(f"verify_sample_period must be an int, got {type(sample_period).__name__}")
    if sample_period < 1:
        raise ValueError(f"verify_sample_period must be >= 1, got {sample_period}")


@dataclass(frozen=True)
class _Block:
    """One inner pool's share of the store: its layers, its column block (a view of the store)
    and whether a page holding its padding slot 0 goes unchecked (an SWA pool)."""

    layers: Sequence[Sequence[torch.Tensor]]
    store: torch.Tensor
    skip_pad: bool


class PageIntegrity:
    """Per-page, per-layer checksums of a host pool's pages, and the load-back check.

    Parameters
    ----------
    device_pool : the device KV pool (``part_buffers``, ``page_size``, ``layer_num``, ``device``),
        or a composite one (``inner_pools``, ``inner_slots``).
    host_pool : its host pool (``size`` slots, whole pages; ``layer_num`` store columns).
    verify : ``"sample"`` or ``"all"`` (build none for ``"off"``: see :meth:`build`).
    sample_period : under ``"sample"``, one load-back in this many is verified.

    Attributes
    ----------
    failures : read-only count of pages found corrupt at load-back (any layer).
    """

    def __init__(
        self, device_pool: DevicePool, host_pool: HostPool, verify: str, sample_period: int = 8
    ) -> None:
        check_verify(verify, sample_period)
        if verify == "off":
            raise ValueError("verify='off' keeps no checksums: use PageIntegrity.build")
        self.mode, self.sample_period = verify, sample_period
        self.page_size, self.device = device_pool.page_size, device_pool.device
        pages = host_pool.size // self.page_size
        self._store = torch.zeros((pages, host_pool.layer_num), dtype=torch.int64)
        pinned = is_cuda(self.device) and pin_tensor(self._store)
        self._unpin = weakref.finalize(self, unpin_tensor, self._store) if pinned else None
        self._device_pool = device_pool
        inner = [device_pool] if isinstance(device_pool, KVPool) else device_pool.inner_pools
        self._blocks, start = [], 0
        for i, pool in enumerate(inner):  # pools after the first: SWA, slot 0 its padding
            block = self._store[:, start : start + pool.layer_num]
            self._blocks.append(_Block(pool.part_buffers, block, skip_pad=i > 0))
            start += pool.layer_num
        self._failures = 0
        self._load_backs = 0

    @classmethod
    def build(
        cls, device_pool: DevicePool, host_pool: HostPool, verify: str, sample_period: int = 8
    ) -> PageIntegrity | None:
        """A :class:`PageIntegrity`, or None for ``verify="off"`` (after validating both)."""
        check_verify(verify, sample_period)
        if verify == "off":
            return None
        assert isinstance(host_pool, (HostKVPool, HybridKVPoolHost)), "a KV host pool"
        return cls(device_pool, host_pool, verify, sample_period)

    @property
    def failures(self) -> int:
        return self._failures

    @property
    def store(self) -> torch.Tensor:
        """The checksum store, int64 ``[host pages, layers]``: storage objects carry its rows
        and a verified storage read restores them (``backends.pages.PageIO.attach_checksums``);
        a row of ``NO_SUM`` (-1) marks a page read from storage without one (left unchecked)."""
        return self._store

    def record(self, host_indices: torch.Tensor, device_indices: torch.Tensor) -> None:
        """Checksum the device source of a backup into the store (on the current stream: call
        on the write stream after the backup's copy, before its finish event).

        ``host_indices``: int64 ``[n]`` CPU; ``device_indices``: int64 ``[n]`` on the device
        (allocator slots); ``n`` a page multiple, token ``i`` going from ``device_indices[i]``
        to ``host_indices[i]``.
        """
        rows = self._rows(host_indices)
        for block, slots in zip(self._blocks, self._inner(device_indices), strict=True):
            record_page_checksums(
                block.layers,
                slots,
                self.page_size,
                block.store,
                rows,
                max_programs=RECORD_PROGRAMS,
                skip_pad=block.skip_pad,
            )

    def select(self) -> bool:
        """Whether the next load-back is to be verified (counts the load-backs asked about)."""
        index, self._load_backs = self._load_backs, self._load_backs + 1
        return self.mode == "all" or index % self.sample_period == 0

    def first_mismatch(
        self, host_indices: torch.Tensor, device_indices: torch.Tensor
    ) -> int | None:
        """Offset (in tokens) into the pairs of the first page whose device copy differs from
        the checksums recorded at its backup, or None when every page matches.

        Runs on the current stream (call on the load stream, after the load) and blocks the CPU
        for one read (two integers per inner pool). Adds the number of differing pages (per
        inner pool) to ``failures``.
        """
        rows = self._rows(host_indices)
        inner = self._inner(device_indices)
        checked = [self._check(b, s, rows) for b, s in zip(self._blocks, inner, strict=True)]
        launched = [(known, result) for known, result in checked if result is not None]
        if not launched:
            return None
        results = torch.stack([result for _, result in launched]).tolist()
        self._failures += sum(count for _, count in results)
        bad = [
            int(known[first])
            for (known, _), (first, count) in zip(launched, results, strict=True)
            if count
        ]
        return min(bad) * self.page_size if bad else None

    def _check(
        self, block: _Block, slots: torch.Tensor, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(the pages of rows with a checksum in block, verify_page_checksums of them)``;
        None for the result when no page has one (pages from storage without a checksum, or
        every page tombstoned at backup for an SWA block)."""
        known = (block.store[rows, 0] != NO_SUM).nonzero().flatten()  # CPU: no device sync
        if known.numel() == 0:
            return known, None
        if known.numel() < rows.numel():
            slots = slots.view(-1, self.page_size)[known.to(slots.device)].flatten()
        result = verify_page_checksums(
            block.layers,
            slots,
            self.page_size,
            block.store,
            rows[known],
            max_programs=VERIFY_PROGRAMS,
            skip_pad=block.skip_pad,
        )
        return known, result

    def _inner(self, device_indices: torch.Tensor) -> list[torch.Tensor]:
        """Each inner pool's slots of allocator slots ``device_indices`` (a plain pool's: them)."""
        pool = self._device_pool
        return [device_indices] if isinstance(pool, KVPool) else pool.inner_slots(device_indices)

    def _rows(self, host_indices: torch.Tensor) -> torch.Tensor:
        """int64 ``[pages]`` CPU: the host page of each page of ``host_indices``."""
        rows: torch.Tensor = host_indices[:: self.page_size] // self.page_size
        return rows
