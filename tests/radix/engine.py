"""A miniature serving loop over fake (or real) pools, driving cache_*_req like an engine."""

from __future__ import annotations

import torch

from hicache.radix import RadixCache, RadixKey, Req

from .fakes import FakeAllocator, FakeReqToTokenPool, check_accounting


class MiniEngine:
    """Admit requests (match + lock + allocate), compute KV, decode, cache, finish."""

    def __init__(
        self,
        page_size: int,
        slots: int = 256,
        rows: int = 16,
        context: int = 64,
        allocator=None,
        pool=None,
        **cache_kw,
    ) -> None:
        self.page_size = page_size
        self.allocator = allocator or FakeAllocator(slots, page_size)
        self.pool = pool or FakeReqToTokenPool(rows, context)
        self.cache = RadixCache(self.pool, self.allocator, page_size, **cache_kw)
        self.live: list[Req] = []

    def admit(self, ids: list[int], extra_key=None, kv_len: int | None = None) -> Req | None:
        """Schedule ``ids`` and compute ``kv_len`` tokens (all by default); None when full."""
        if self.pool.available_size() == 0:
            return None
        match = self.cache.match_prefix(RadixKey(ids, extra_key))
        self.cache.inc_lock_ref(match.last_device_node)
        prefix = len(match.device_indices)
        row = self.pool.alloc(1)[0]
        self.pool.write((row, slice(0, prefix)), match.device_indices)
        req = Req(
            row,
            list(ids),
            kv_len=prefix,
            extra_key=extra_key,
            prefix_indices=match.device_indices,
            last_node=match.last_device_node,
            cache_protected_len=prefix,
        )
        self.live.append(req)
        if not self.compute(req, max(prefix, len(ids) if kv_len is None else kv_len)):
            self.abort(req)
            return None
        return req

    def compute(self, req: Req, new_kv_len: int) -> bool:
        """Give positions [kv_len, new_kv_len) slots (whole pages; the last page's rest too)."""
        p, table = self.page_size, self.pool.req_to_token
        need = -(-new_kv_len // p) - -(-req.kv_len // p)
        pages = self._alloc(need * p)
        if pages is None:
            return False
        taken = 0
        for pos in range(req.kv_len, new_kv_len):
            if pos % p == 0:
                table[req.req_pool_idx, pos] = int(pages[taken * p])
                taken += 1
            else:
                table[req.req_pool_idx, pos] = int(table[req.req_pool_idx, pos - pos % p]) + pos % p
        req.kv_len = new_kv_len
        return True

    def _alloc(self, n: int) -> torch.Tensor | None:
        if n == 0:
            return torch.empty(0, dtype=torch.int64)
        if self.allocator.available_size() < n:
            self.cache.evict(n - self.allocator.available_size())
        return self.allocator.alloc(n)

    def decode(self, req: Req, token: int) -> bool:
        """Compute the KV of the last sampled token (if any), then sample ``token``."""
        if req.output_ids and not self.compute(req, req.kv_len + 1):
            return False
        req.output_ids.append(token)
        return True

    def finish(self, req: Req) -> None:
        self.live.remove(req)
        self.cache.cache_finished_req(req)

    def abort(self, req: Req) -> None:
        """Drop a request without caching (its own pages freed, lock released)."""
        self.live.remove(req)
        row = self.pool.req_to_token[req.req_pool_idx, req.cache_protected_len : req.kv_len]
        if row.numel():
            self.allocator.free(row.to(torch.int64))
        self.pool.free(req.req_pool_idx)
        self.cache.dec_lock_ref(req.last_node)

    def check(self) -> None:
        self.cache.check_invariants()
        check_accounting(self.cache, self.allocator, self.pool.req_to_token, self.live)
