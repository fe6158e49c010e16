"""Staged backups: the kernel backend's backup without the SMs storing to host memory.

An SM-issued backup keeps its blocks resident for the whole PCIe-bound copy, and its stores to
pinned host memory slow a concurrent matmul well beyond what holding the SMs costs
(``bench_sm_cost.py``: +5-18 % over idle blocks at block quota 2, benchmarks/RESULTS.md). A
staged backup moves each chunk of the batch in two steps on the caller's stream:

1. the batch's own kernel route gathers the chunk's scattered device slots into a small device
   buffer laid out like the host pool (device to device: HBM-bound, a short burst at a larger
   block quota);
2. the copy engines move that buffer to the chunk's host slots (``transfer_kv_direct``: one
   copy per run of consecutive host slots, per layer and part when the layout is layer_first).

The next chunk's gather queues behind the previous chunk's copies on the same stream, so a
:class:`BackupStaging` must only ever be used from one stream (the controller's write stream).
A batch is staged only when its host runs are long enough for the engines
(:meth:`BackupStaging.suits`); otherwise the plain kernel backup runs.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from hicache import env, kernels
from hicache.checks import check_int
from hicache.pools.auto_backend import ENGINE_MIN_RUN_BYTES, mean_run
from hicache.pools.device_pool import KVPool, pointer_table
from hicache.pools.host_layouts import part_shape
from hicache.pools.layer_ops import KERNEL_OPS

logger = logging.getLogger(__name__)
GATHER_BLOCK_QUOTA = 16  # programs of one gather: it is HBM-bound and should end quickly
Tensor = torch.Tensor


class BackupStaging:
    """A device buffer of ``slots`` slots in ``host_pool``'s layout, for staged backups.

    Parameters
    ----------
    host_pool : a kernel-layout host pool (layer_first, page_first, page_head).
    slots : staging capacity, rounded down to whole pages (at least one page).
    block_quota : programs of each gather launch.

    It satisfies the routes' ``HostBuffers`` protocol, so the kernel route that backs a batch up
    to the host pool gathers into it unchanged. Raises ``ValueError`` for a layout no kernel
    route serves, fewer slots than a page or a ``block_quota`` below 1; ``TypeError`` for a
    non-int count.
    """

    def __init__(self, host_pool: Any, slots: int, block_quota: int = GATHER_BLOCK_QUOTA) -> None:
        device_pool: KVPool = host_pool.device_pool
        route = KERNEL_OPS.get((host_pool.parts, host_pool.layout))
        if route is None:
            raise ValueError(f"host_pool.layout={host_pool.layout!r} has no kernel route")
        page = host_pool.page_size
        check_int("slots", slots, minimum=page)  # at least one page
        check_int("block_quota", block_quota, minimum=1)
        self.route, self.block_quota = route, block_quota
        self.geometry, self.layout = host_pool.geometry, host_pool.layout
        self.page_size = page
        self.size = slots // page * page
        self.layer_num, self.item_size = host_pool.layer_num, host_pool.item_size
        self.layout_dim, self.head_num = host_pool.layout_dim, host_pool.head_num
        self.closed = False
        device = torch.device(device_pool.device)
        shape = part_shape(
            self.layout, self.size, page, self.layer_num, self.head_num, host_pool.head_dim
        )
        buffer = torch.empty((host_pool.parts, *shape), dtype=host_pool.store_dtype, device=device)
        self.host_parts = list(buffer)
        self.host_ptr_tables = (
            [pointer_table(list(part), device) for part in self.host_parts]
            if self.layout == "layer_first"
            else None
        )
        self.slots = torch.arange(self.size, device=device)
        self.slots_cpu = torch.arange(self.size)

    @property
    def nbytes(self) -> int:
        return sum(part.numel() * part.element_size() for part in self.host_parts)

    def suits(self, host_indices: Tensor) -> bool:
        """Whether the engines copy ``host_indices`` at line rate: on the CPU, with a mean run
        of consecutive slots of at least ``ENGINE_MIN_RUN_BYTES`` per copy."""
        if host_indices.is_cuda:
            return False
        unit = self.item_size if self.layout == "layer_first" else self.layout_dim
        return bool(mean_run(host_indices, host_indices) * unit >= ENGINE_MIN_RUN_BYTES)

    def backup(
        self, host_pool: Any, device_pool: KVPool, host_indices: Tensor, device_indices: Tensor
    ) -> None:
        """Copy every layer of ``device_indices`` (on the device pool's device) to
        ``host_indices`` (CPU) of ``host_pool``, chunk by chunk through this buffer, on the
        current stream. Indices are checked by the caller (``HostKVPool``)."""
        for start in range(0, host_indices.numel(), self.size):
            host = host_indices[start : start + self.size]
            n = host.numel()
            gather = self.slots[:n]
            self.route.backup(self, device_pool, gather, device_indices[start : start + n],
                              self.block_quota)  # fmt: skip
            kernels.transfer_kv_direct(*self._copies(host_pool, host))

    def _copies(
        self, host_pool: Any, host: Tensor
    ) -> tuple[list[Tensor], list[Tensor], Tensor, Tensor, int]:
        """``transfer_kv_direct``'s arguments for staged slots ``0 .. len(host)`` -> ``host``:
        a layer_first buffer per (part, layer); a slot-major part whole (page_first); a
        page_head part by pages, whose data is contiguous only per page."""
        n, page = host.numel(), self.page_size
        if self.layout == "layer_first":
            src = [layer for part in self.host_parts for layer in part]
            dst = [layer for part in host_pool.host_parts for layer in part]
            return src, dst, self.slots_cpu[:n], host, page
        if self.layout == "page_first":
            return self.host_parts, host_pool.host_parts, self.slots_cpu[:n], host, page
        pages = n // page
        return (
            self.host_parts,
            host_pool.host_parts,
            self.slots_cpu[:pages],
            host[::page] // page,
            1,
        )


def check_staging(staging: object, host_pool: Any) -> None:
    """``TypeError`` unless ``staging`` is None or a :class:`BackupStaging`; ``ValueError``
    unless it was built for a host pool of ``host_pool``'s geometry and layout."""
    if staging is None:
        return
    if not isinstance(staging, BackupStaging):
        raise TypeError(f"staging must be a BackupStaging or None, got {type(staging).__name__}")
    if (staging.geometry, staging.layout) != (host_pool.geometry, host_pool.layout):
        raise ValueError("staging was built for a host pool of another geometry or layout")


def controller_staging(host_pool: Any, io_backend: str) -> BackupStaging | None:
    """The staging buffer of a controller's write stream: ``env.backup_staging_bytes()`` of
    device memory when the host pool is pinned for a CUDA device pool and ``io_backend`` may run
    the kernel on its layout (``"kernel"``, or ``"auto"`` on a layout with a kernel route);
    None otherwise, when the setting is 0, or for a composite device pool (a
    ``HybridKVPoolHost``'s). Never more slots than the device pool has."""
    if not isinstance(getattr(host_pool, "device_pool", None), KVPool):
        return None
    nbytes = env.backup_staging_bytes()
    routed = (host_pool.parts, host_pool.layout) in KERNEL_OPS
    if not (nbytes and routed and host_pool.pinned) or io_backend == "direct":
        return None
    slots = min(nbytes // (host_pool.parts * host_pool.layout_dim), host_pool.device_pool.size)
    staging = BackupStaging(host_pool, max(slots, host_pool.page_size))
    logger.info(
        "backup staging: %d slots, %.1f MiB on %s", staging.size, staging.nbytes / 2**20,
        host_pool.device_pool.device,
    )  # fmt: skip
    return staging
