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

import torch

from hicache.devices import is_cuda, pin_tensor, unpin_tensor
from hicache.kernels.checksum import NO_SUM, record_page_checksums, verify_page_checksums
from hicache.pools import DevicePool, HostKVPool, HostPool, KVPool

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


class PageIntegrity:
    """Per-page, per-layer checksums of a host pool's pages, and the load-back check.

    Parameters
    ----------
    device_pool : the device KV pool (``part_buffers``, ``page_size``, ``layer_num``, ``device``).
    host_pool : its host pool (``size`` slots, whole pages).
    verify : ``"sample"`` or ``"all"`` (build none for ``"off"``: see :meth:`build`).
    sample_period : under ``"sample"``, one load-back in this many is verified.

    Attributes
    ----------
    failures : read-only count of pages found corrupt at load-back (any layer).
    """

    def __init__(
        self, device_pool: KVPool, host_pool: HostKVPool, verify: str, sample_period: int = 8
    ) -> None:
        check_verify(verify, sample_period)
        if verify == "off":
            raise ValueError("verify='off' keeps no checksums: use PageIntegrity.build")
        self.mode, self.sample_period = verify, sample_period
        self.page_size, self.device = device_pool.page_size, device_pool.device
        self._layers = device_pool.part_buffers
        pages = host_pool.size // self.page_size
        self._store = torch.zeros((pages, device_pool.layer_num), dtype=torch.int64)
        pinned = is_cuda(self.device) and pin_tensor(self._store)
        self._unpin = weakref.finalize(self, unpin_tensor, self._store) if pinned else None
        self._failures = 0
        self._load_backs = 0

    @classmethod
    def build(
        cls, device_pool: DevicePool, host_pool: HostPool, verify: str, sample_period: int = 8
    ) -> PageIntegrity | None:
        """A :class:`PageIntegrity`, or None for ``verify="off"`` (after validating both; the
        controller refuses any other mode for a composite pool first)."""
        check_verify(verify, sample_period)
        if verify == "off":
            return None
        assert isinstance(device_pool, KVPool) and isinstance(host_pool, HostKVPool), "plain"
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

        ``host_indices``: int64 ``[n]`` CPU; ``device_indices``: int64 ``[n]`` on the device;
        ``n`` a page multiple, token ``i`` going from ``device_indices[i]`` to ``host_indices[i]``.
        """
        record_page_checksums(
            self._layers,
            device_indices,
            self.page_size,
            self._store,
            self._rows(host_indices),
            max_programs=RECORD_PROGRAMS,
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
        for one read of two integers. Adds the number of differing pages to ``failures``.
        """
        rows = self._rows(host_indices)
        known = (self._store[rows, 0] != NO_SUM).nonzero().flatten()  # CPU: no device sync
        if known.numel() < rows.numel():  # pages from storage without a checksum: unchecked
            if known.numel() == 0:
                return None
            pages = device_indices.view(-1, self.page_size)
            device_indices = pages[known.to(device_indices.device)].flatten()
            rows = rows[known]
        result = verify_page_checksums(
            self._layers,
            device_indices,
            self.page_size,
            self._store,
            rows,
            max_programs=VERIFY_PROGRAMS,
        )
        first, count = result.tolist()
        self._failures += count
        return int(known[first]) * self.page_size if count else None

    def _rows(self, host_indices: torch.Tensor) -> torch.Tensor:
        """int64 ``[pages]`` CPU: the host page of each page of ``host_indices``."""
        rows: torch.Tensor = host_indices[:: self.page_size] // self.page_size
        return rows
