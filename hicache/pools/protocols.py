"""The seams other packages type against: what a slot allocator of a device pool offers."""

from __future__ import annotations

from typing import Protocol

import torch

from hicache.pools.device_pool import KVPool


class SlotAllocator(Protocol):
    """A device slot allocator (``TokenToKVPoolAllocator`` or a test double).

    ``alloc(n)`` returns ``n`` int64 device slots in whole pages, or None when short (nothing
    allocated); ``free(indices)`` returns them (raising, state unchanged, on slots that are not
    allocated); ``get_kvcache()`` is the device KV pool the slots index, or None.
    """

    page_size: int

    def alloc(self, n: int) -> torch.Tensor | None: ...

    def free(self, indices: torch.Tensor) -> object: ...

    def get_kvcache(self) -> KVPool | None: ...
