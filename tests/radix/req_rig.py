"""Real pools under a RadixCache or HiRadixCache, a scheduler's request protocol, and the whole
observable state (to assert that a rejected call changed nothing). Public APIs only."""

from __future__ import annotations

import torch

from hicache.pools import MHATokenToKVPool, ReqToTokenPool, TokenToKVPoolAllocator
from hicache.radix import HiRadixCache, RadixCache, RadixKey, Req

from .fakes import check_accounting, snapshot

KINDS = ["radix", "hiradix"]


class Rig:
    """A cache over a 64-page float32 device pool, 4 request rows of 128 positions."""

    def __init__(self, kind: str = "radix", page_size: int = 1, pages: int = 64) -> None:
        size = pages * page_size
        self.page_size = page_size
        self.kv = MHATokenToKVPool(size, page_size, torch.float32, 2, 4, 2, "cpu")
        self.allocator = TokenToKVPoolAllocator(size, page_size, "cpu", kvcache=self.kv)
        self.req_pool = ReqToTokenPool(4, 128, "cpu")
        cls = HiRadixCache if kind == "hiradix" else RadixCache
        self.cache = cls(self.req_pool, self.allocator, page_size)
        self.live: list[Req] = []

    def schedule(self, ids: list[int], extra_key=None) -> Req:
        """match + lock + row + slots for the uncached rest; ``kv_len = len(ids)``."""
        match = self.cache.match_prefix(RadixKey(ids, extra_key))
        self.cache.inc_lock_ref(match.last_device_node)
        prefix = len(match.device_indices)
        row = self.req_pool.alloc(1)[0]
        rest = len(ids) - prefix
        need = -(-rest // self.page_size) * self.page_size
        if self.allocator.available_size() < need:
            self.cache.evict(need - self.allocator.available_size())
        own = self.allocator.alloc(need)
        assert own is not None, "rig: device pool too small"
        slots = torch.cat([match.device_indices, own[:rest]])
        self.req_pool.write((row, slice(0, len(ids))), slots.to(torch.int32))
        req = Req(
            row,
            list(ids),
            kv_len=len(ids),
            extra_key=extra_key,
            prefix_indices=match.device_indices,
            last_node=match.last_device_node,
            cache_protected_len=prefix,
        )
        self.live.append(req)
        return req

    def finish(self, req: Req) -> None:
        self.cache.cache_finished_req(req)
        self.live.remove(req)

    def state(self) -> tuple:
        """Tree, sizes, locks and every pool's free count."""
        return (
            snapshot(self.cache),
            self.allocator.available_size(),
            self.req_pool.available_size(),
            tuple(self.allocator.free_slots().tolist()),
        )

    def check(self) -> None:
        """Tree and allocator invariants; every page free or owned exactly once."""
        self.cache.check_invariants()
        self.allocator.check_invariants()
        check_accounting(
            self.cache,
            self.allocator,
            self.req_pool.req_to_token,
            [r for r in self.live if r.req_pool_idx is not None],
        )
