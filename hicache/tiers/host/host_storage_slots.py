"""StorageSlots: the host slots a ``HostTier`` lends a storage tier below it.

A prefetch reserves host slots (``reserve``, after ``make_room``) before its read, then each
slot is adopted by a new host-only leaf (``adopt``) or given back (``release``); ``reserved``
counts those in between, so the host pool's slots stay accounted for (``host_checks``). Host
eviction takes its leaves through the storage tier (``victims``), which may write them first.
"""

from __future__ import annotations

import torch

from hicache.controller import HiCacheController
from hicache.radix.events import HOST, NodeEvents
from hicache.radix.node import TreeNode
from hicache.radix.policies import LeafSet
from hicache.radix.tier import BelowHost, TierSite


class StorageSlots:
    """Mixed into ``HostTier``, which owns the state named below."""

    controller: HiCacheController
    site: TierSite
    events: NodeEvents | None
    _size: int
    _reserved: int

    leaves: LeafSet
    below: BelowHost | None

    def evict(self, num_tokens: int) -> int:
        raise NotImplementedError  # ``HostTier.evict``

    def reserved(self) -> int:
        """Host slots reserved (``reserve``) and not yet adopted or released."""
        return self._reserved

    def make_room(self, num_tokens: int) -> bool:
        """Evict host-only leaves until ``num_tokens`` host slots are free; whether they are."""
        short = num_tokens - self.controller.mem_pool_host.available_size()
        return short <= 0 or self.evict(short) >= short

    def reserve(self, num_tokens: int) -> torch.Tensor | None:
        """``num_tokens`` host slots (a page multiple; int64 CPU) owned by the caller until
        ``adopt`` or ``release`` (``make_room`` first); None when the pool refuses."""
        slots = self.controller.mem_pool_host.alloc(num_tokens)
        if slots is not None:
            self._reserved += num_tokens
        return slots

    def release(self, slots: torch.Tensor) -> None:
        """Give reserved host ``slots`` back to the pool."""
        if slots.numel():
            self._reserved -= slots.numel()
            self.controller.evict_host(slots)

    def adopt(self, leaf: TreeNode, child_key: object) -> None:
        """Link the new host-only leaf ``leaf`` (its ``host_slots`` reserved here, its parent
        the root or backed up) under its parent at ``child_key``."""
        assert leaf.host_slots is not None and leaf.slots is None
        n = len(leaf.key)
        self._reserved -= n
        self._size += n
        self.site.add_host_leaf(leaf, child_key)
        if self.events is not None:
            self.events.stored(leaf, HOST)
