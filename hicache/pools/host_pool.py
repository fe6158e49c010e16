"""Host KV pools (L2): one CPU buffer per pool, pinned when the device pool is on CUDA.

``load_to_device_per_layer``, ``plan_load`` (every layer of a load, planned once:
:mod:`hicache.pools.load_plan`, the ``hicache.kernels.plan_*`` form of the same op) and
``backup_from_device_all_layer`` route each (layout, io_backend) pair to its transfer op in
:mod:`hicache.kernels` (the table: :mod:`hicache.pools.layer_ops`); others raise ``ValueError``.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from hicache.checks import check_slot_indices
from hicache.devices import is_cuda
from hicache.pools.allocator import PageAllocator
from hicache.pools.auto_backend import resolve as resolve_backend
from hicache.pools.backup_staging import BackupStaging, check_staging
from hicache.pools.device_pool import KVPool, geometry_mismatch, pointer_table
from hicache.pools.host_layouts import (
    LAYOUTS,
    check_layout,
    check_pair,
    check_ram,
    host_slots,
    part_shape,
)
from hicache.pools.host_memory import pin_buffer, unpin_chunks
from hicache.pools.layer_ops import BLOCK_QUOTA, KERNEL_OPS, direct_backup, direct_load
from hicache.pools.load_plan import LoadPlan, LoadPlanners
from hicache.pools.slot_ids import SlotIds

_CPU = torch.device("cpu")


class HostKVPool:
    """Contract and shared machinery of the host pools.

    Parameters
    ----------
    device_pool : the device KV pool this pool backs up (dtype, layers, heads taken from it).
    host_to_device_ratio : host slots = ratio * device slots, used when ``host_size_gb <= 0``.
    host_size_gb : host pool size in GB (1e9 bytes) when > 0.
    page_size : must equal ``device_pool.page_size``; size is rounded up to whole pages.
    layout : one of ``layer_first``, ``page_first``, ``page_first_direct``, ``page_head`` (MHA).
    pin_memory : bool; page-lock the buffer (``cudaHostRegister``) when ``device_pool`` is on
        CUDA.
    io_backend : optional ``"auto"``/``"kernel"``/``"direct"``; when given, the (layout,
        io_backend) pair is checked here instead of at the first transfer. Each transfer call
        takes its own ``io_backend``; ``"auto"`` picks one per call
        (:mod:`hicache.pools.auto_backend`).
    slots : exact host slots (a page multiple), replacing ``host_to_device_ratio`` and
        ``host_size_gb`` (the inner pools of a ``HybridKVPoolHost`` share one count).

    Raises ``ValueError`` before allocating on a bad layout/pair, a host pool of no page (any
    size above, smaller than the device pool too, works), or one larger than available RAM
    minus ``HICACHE_HOST_RAM_RESERVE_GB``.
    Host slots are ``0 .. size - 1`` (no reserved page); ``close()`` unpins (also on GC).
    """

    parts: int  # K and V buffers (2), or one latent buffer (1)
    layouts: tuple[str, ...] = LAYOUTS
    device_pool_type: type[KVPool] = KVPool

    def __init__(
        self,
        device_pool: KVPool,
        host_to_device_ratio: float,
        host_size_gb: float,
        page_size: int,
        layout: str,
        pin_memory: bool = True,
        *,
        io_backend: str | None = None,
        slots: int | None = None,
    ) -> None:
        self._check_args(device_pool, page_size, layout, pin_memory, io_backend)
        self.device_pool = device_pool
        geometry = self.geometry = device_pool.geometry  # of the pool it was built for
        self.page_size, self.layout = geometry.page_size, layout
        self.layer_num, self.item_size = geometry.layer_num, geometry.item_size
        self.dtype, self.store_dtype = geometry.dtype, device_pool.store_dtype
        self.head_num, self.head_dim = geometry.row_shape
        self.layout_dim = self.item_size * self.layer_num
        self.device = _CPU
        self.slot_bytes = self.layout_dim * self.parts  # one host slot: every part and layer
        self.size = host_slots(
            device_pool.size, host_to_device_ratio, host_size_gb, page_size, self.slot_bytes, slots
        )
        check_ram(self.size * self.slot_bytes)
        self._allocator = PageAllocator(self.size // page_size, page_size)
        self._buffer = self._allocate()
        self.pinned = pin_memory and is_cuda(device_pool.device)
        self._unpin = self._pin() if self.pinned else None
        self.closed = False
        self.host_parts = [self._buffer[i] for i in range(self.parts)]
        self.host_ptr_tables = self._pointer_tables(device_pool.device)
        self._planners = LoadPlanners()
        self.slot_ids = SlotIds(self.size, device_pool.device)  # host slot ids, on the device

    @classmethod
    def _check_args(
        cls,
        device_pool: KVPool,
        page_size: int,
        layout: str,
        pin_memory: bool,
        io_backend: str | None,
    ) -> None:
        expected = cls.device_pool_type  # of its kind: a subclass's extra buffers aren't carried
        if not isinstance(device_pool, expected) or device_pool.kind != expected.kind:
            raise TypeError(
                f"device_pool must be a {expected.__name__} of kind {expected.kind!r}, "
                f"got a {type(device_pool).__name__} of kind {getattr(device_pool, 'kind', None)!r}"
            )
        if page_size != (want := device_pool.geometry.page_size):
            raise ValueError(f"page_size must equal device_pool.page_size={want}, got {page_size}")
        check_layout(layout, cls.layouts)
        if io_backend is not None:
            check_pair(layout, io_backend)
        if not isinstance(pin_memory, bool):
            raise TypeError(f"pin_memory must be a bool, got {type(pin_memory).__name__}")

    def _allocate(self) -> torch.Tensor:
        shape = part_shape(
            self.layout, self.size, self.page_size, self.layer_num, self.head_num, self.head_dim
        )
        return torch.empty((self.parts, *shape), dtype=self.store_dtype, device=_CPU)

    def _pin(self) -> weakref.finalize[Any, Any]:
        """Page-lock the buffer (``host_memory.pin_buffer``, logged); the finalizer unpins it.
        Chunks break only between whole layers (layer_first) or pages (the others), where no
        engine copy crosses."""
        if self.layout == "layer_first":
            unit = self.size * self.item_size  # bytes of one layer of one part
        else:
            unit = self.page_size * self.layout_dim
        chunks, _ = pin_buffer(self._buffer, unit)
        return weakref.finalize(self, unpin_chunks, chunks)

    def _pointer_tables(self, device: torch.device) -> list[torch.Tensor] | None:
        # layer_first kernel backups address host layers through tables on the kernel's device.
        if self.layout != "layer_first":
            return None
        return [pointer_table(list(part), device) for part in self.host_parts]

    # -- slot accounting ------------------------------------------------------------------------

    def alloc(self, n: int) -> torch.Tensor | None:
        """``n`` host slots (int64, CPU, whole pages; ``n`` a page multiple) or None when short."""
        return self._allocator.alloc_cpu(n)

    def free(self, indices: torch.Tensor) -> int:
        """Free the pages holding ``indices`` (any device); returns the number of slots freed."""
        return self._allocator.free(indices)

    def available_size(self) -> int:
        return self._allocator.available_size()

    def clear(self) -> None:
        self._allocator.clear()

    def free_slots(self) -> torch.Tensor:
        """Every free host slot, sorted int64 CPU."""
        return self._allocator.free_slots()

    def check_invariants(self) -> None:
        self._allocator.check_invariants()

    def close(self) -> None:
        """Release the pinned registration (idempotent); later transfers raise RuntimeError."""
        if self._unpin is not None:
            self._unpin()
        self.pinned = False
        self.closed = True

    # -- transfers ------------------------------------------------------------------------------

    def load_to_device_per_layer(
        self,
        device_pool: KVPool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: str,
    ) -> None:
        """Copy layer ``layer_id`` of host slots ``host_indices`` to ``device_indices``.

        Indices are equally long int64 tensors on CPU or the device pool's device; they are
        moved (non-blocking) where the op needs them. Runs on the current stream.
        """
        backend, host_idx, dev_idx = self._prepare(
            device_pool, host_indices, device_indices, io_backend
        )
        device_pool.check_layer(layer_id)
        if backend == "direct":
            direct_load(self, device_pool, host_idx, dev_idx, layer_id)
        else:
            ops = KERNEL_OPS[(self.parts, self.layout)]
            ops.load(self, device_pool, host_idx, dev_idx, layer_id)

    def plan_load(
        self,
        device_pool: KVPool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
    ) -> LoadPlan:
        """Validate and plan, once, the load of every layer of ``host_indices`` to
        ``device_indices``; ``plan.run(layer_id)`` then copies one layer, checking only its id.

        Runs every check of :meth:`load_to_device_per_layer` except the layer id, and moves the
        indices (non-blocking) on the current stream: plan on the stream the layers run on.
        Layer buffers are validated once per device pool and backend (``LoadPlanners``).
        """
        backend, host_idx, dev_idx = self._prepare(
            device_pool, host_indices, device_indices, io_backend
        )
        runner = self._planners.plan(self, device_pool, host_idx, dev_idx, backend)
        return LoadPlan(self, device_pool, runner, dev_idx)

    def backup_from_device_all_layer(
        self,
        device_pool: KVPool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
        staging: BackupStaging | None = None,
    ) -> None:
        """Copy every layer of device slots ``device_indices`` to host slots ``host_indices``;
        a kernel batch goes through ``staging`` (built for this pool) when its CPU host indices
        suit it."""
        check_staging(staging, self)
        backend, host_idx, dev_idx = self._prepare(
            device_pool, host_indices, device_indices, io_backend, staging
        )
        if backend == "direct":
            direct_backup(self, device_pool, host_idx, dev_idx)
        elif backend == "staged":
            assert staging is not None
            staging.backup(self, device_pool, host_idx, dev_idx)
        else:
            route = KERNEL_OPS[(self.parts, self.layout)]
            route.backup(self, device_pool, host_idx, dev_idx, BLOCK_QUOTA)

    def _prepare(
        self,
        device_pool: Any,
        host_indices: Any,
        device_indices: Any,
        io_backend: str,
        staging: BackupStaging | None = None,
    ) -> tuple[str, torch.Tensor, torch.Tensor]:
        """Checks, then the concrete backend (``"auto"`` resolved without waiting for the GPU;
        ``"staged"``: a kernel backup ``staging`` suits) and the indices where it needs them."""
        if self.closed:
            raise RuntimeError("this host pool is closed")
        check_pair(self.layout, io_backend)
        self._check_device_pool(device_pool)
        check_slot_indices("host_indices", host_indices, self.size)
        check_slot_indices("device_indices", device_indices, device_pool.num_slots)
        if host_indices.numel() != device_indices.numel():
            raise ValueError(
                f"host_indices ({host_indices.numel()}) and device_indices "
                f"({device_indices.numel()}) must be equally long"
            )
        backend = resolve_backend(
            io_backend, self.layout, host_indices, device_indices, self.item_size
        )
        # Kernels run where the device pool lives (CPU host indices as a view of the kept ids
        # or copied from pinned memory, ``SlotIds``); direct ops plan their runs on the CPU and so
        # need the indices there now (a blocking copy: a non-blocking D2H copy may not have landed).
        target = device_pool.device
        if backend == "kernel" and staging is not None and staging.suits(host_indices):
            return "staged", host_indices, device_indices.to(target, non_blocking=True)
        if backend == "kernel":
            if host_indices.device.type == "cpu":  # a view of the kept ids, or a copy
                host_indices = self.slot_ids.on_device(host_indices, target)
            dev = device_indices.to(target, non_blocking=True)
            return backend, host_indices.to(target, non_blocking=True), dev
        return backend, host_indices.to(_CPU), device_indices.to(_CPU)

    def mismatch(self, device_pool: Any) -> list[str]:
        """How ``device_pool`` differs from the pool this host pool was built for (a query):
        ``PageGeometry.mismatch``'s entries (``"head_dim: host pool 8, device pool 16"``)."""
        if device_pool is self.device_pool:
            return []
        return geometry_mismatch(self.geometry, device_pool)

    def _check_device_pool(self, device_pool: Any) -> None:
        differences = self.mismatch(device_pool)
        if differences:
            raise ValueError(
                "device_pool does not match the pool this host pool was built for: "
                + "; ".join(differences)
            )
