"""The seams other packages type against: what a slot allocator of a device pool offers."""

from __future__ import annotations

from typing import Protocol

import torch

from hicache.pools.device_pool import KVPool


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

    def get_kvcache(self) -> KVPool | None: ...
