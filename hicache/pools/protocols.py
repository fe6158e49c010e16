"""The seams other packages type against: a slot allocator of a device pool, the device pools a
host tier backs up, and what the controller and the host tier call on a host pool."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from hicache.pools.backup_staging import BackupStaging
from hicache.pools.composite_pool import CompositeKVPool
from hicache.pools.device_pool import KVPool
from hicache.pools.load_plan import LayerRunner

DevicePool = KVPool | CompositeKVPool
"""A device KV pool the host tier backs up: a plain one, or a composite (hybrid model) one."""


class SlotAllocator(Protocol):
    """A device slot allocator (``TokenToKVPoolAllocator`` or a test double).

    Its usable slots are ``page_size .. size + page_size - 1`` on ``device`` (slot 0's page is
    reserved). ``alloc(n)`` returns ``n`` int64 device slots in whole pages, or None when short
    (nothing allocated); ``free(indices)`` returns them (raising, state unchanged, on slots that
    are not allocated); ``available_size()`` counts the free slots, ``free_slots()`` lists them
    (int64, CPU); ``get_kvcache()`` is the device KV pool the slots index, or None.
    """

    size: int
    page_size: int
    device: torch.device

    def available_size(self) -> int: ...

    def free_slots(self) -> torch.Tensor: ...

    def alloc(self, n: int) -> torch.Tensor | None: ...

    def free(self, indices: torch.Tensor) -> object: ...

    def get_kvcache(self) -> DevicePool | None: ...


class LayerLoad(LayerRunner, Protocol):
    """A load batch planned for every layer: ``run(l)`` for ``l`` in ``[0, num_layers)``."""

    @property
    def num_layers(self) -> int: ...


class HostPool(Protocol):
    """A host KV pool as the controller and the host tier use it: a ``HostKVPool`` (its
    docstrings hold the contract) or a ``HybridKVPoolHost``.

    Attributes
    ----------
    size, page_size : host slots ``0 .. size - 1``, in pages of ``page_size``.
    layout : the host layout; ``item_size``: bytes of one slot in one layer of one part (what
        ``io_backend="auto"`` weighs); ``slot_bytes``: bytes of one host slot, every layer.
    layer_num : layers a load plan runs (``LayerLoad.num_layers``): the controller's
        ``LayerDoneCounter`` counts these.
    pinned : whether the buffers are page-locked for a CUDA device pool.
    """

    size: int
    page_size: int
    layout: str
    item_size: int
    slot_bytes: int
    layer_num: int
    pinned: bool

    def alloc(self, n: int) -> torch.Tensor | None: ...

    def free(self, indices: torch.Tensor) -> int: ...

    def available_size(self) -> int: ...

    def clear(self) -> None: ...

    def free_slots(self) -> torch.Tensor: ...

    def check_invariants(self) -> None: ...

    def close(self) -> None: ...

    def mismatch(self, device_pool: Any) -> list[str]: ...

    def plan_load(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
    ) -> LayerLoad: ...

    def backup_from_device_all_layer(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
        staging: BackupStaging | None = None,
    ) -> None: ...
