"""A serving rig over real CPU pools for the misuse state machine: requests, snapshot, ownership.

:class:`Rig` drives a ``RadixCache`` or ``HiRadixCache`` the way an engine does (the protocol in
``hicache.radix.req``): it schedules requests (match, lock, load back, allocate, write the row),
computes more of their KV, caches and finishes them, and inserts freshly allocated slots.
:meth:`Rig.snapshot` captures everything a rejected call must leave alone; :meth:`Rig.check`
runs every component's own invariant check and verifies, from public data only, that every device
page is free, in exactly one tree node or held by exactly one live request, and every host slot
free or in exactly one node.
"""

from __future__ import annotations

from typing import Any

import torch

from hicache.pools import MHATokenToKVPool, ReqToTokenPool, TokenToKVPoolAllocator
from hicache.radix import HiRadixCache, RadixCache, RadixKey, Req, TreeNode
from hicache.radix.invariants import iter_nodes
from tests.radix.hiradix_rig import DIM, HEADS, LAYERS

SLOTS = 48  # device slots (the host tier gets twice as many)
ROWS = 2  # request rows: few, so a finished request's row is soon reused
MAX_TOKENS = 24  # prompt + output tokens of one request (rows hold 4 * SLOTS)


def _pools(page_size: int) -> tuple[ReqToTokenPool, TokenToKVPoolAllocator]:
    pool = MHATokenToKVPool(SLOTS, page_size, torch.float32, HEADS, DIM, LAYERS, "cpu")
    allocator = TokenToKVPoolAllocator(SLOTS, page_size, "cpu", kvcache=pool)
    return ReqToTokenPool(ROWS, 4 * SLOTS, "cpu"), allocator


def make_radix(page_size: int, eviction_policy: str) -> RadixCache:
    """A RadixCache over a real ``MHATokenToKVPool`` of ``SLOTS`` slots and ``ROWS`` rows."""
    return RadixCache(*_pools(page_size), page_size, eviction_policy=eviction_policy)


def make_hiradix(page_size: int, write_policy: str) -> HiRadixCache:
    """The same with a host tier twice the device's; host hits of any length are loaded."""
    return HiRadixCache(
        *_pools(page_size), page_size, write_policy=write_policy, load_back_threshold=1
    )


def _slot_list(slots: torch.Tensor | None) -> tuple[int, ...] | None:
    return None if slots is None else tuple(slots.tolist())


def _req_state(req: Req) -> tuple:
    last = None if req.last_node is None else req.last_node.id
    return (
        req.req_pool_idx,
        req.kv_len,
        req.cache_protected_len,
        last,
        req.prefix_indices.tolist(),
        repr(req.extra_key),
        list(req.output_ids),
    )


def _node_state(node: TreeNode) -> tuple:
    parent = None if node.parent is None else node.parent.id
    return (
        node.id,
        parent,
        repr(node.extra_key),
        tuple(node.key.tolist()),
        _slot_list(node.value),
        _slot_list(node.host_value),
        node.lock_ref,
        node.hit_count,
        node.last_access_time,
        node.priority,
    )


class Rig:
    """A cache with real pools, its live requests and the locks the caller holds."""

    def __init__(self, cache: RadixCache) -> None:
        self.cache = cache
        self.allocator = cache.token_to_kv_pool_allocator
        self.rows = cache.req_to_token_pool
        self.page = cache.page_size
        hi = isinstance(cache, HiRadixCache)
        self.host = cache.cache_controller.mem_pool_host if hi else None
        self.live: list[Req] = []
        self.finished: list[Req] = []  # the last few finished requests (to finish again)
        self.locks: list[TreeNode] = []  # nodes we called inc_lock_ref on
        self.seen: list[list[int]] = []  # recent token sequences, to share prefixes with

    def compose(self, base: int, cut: int, tail: list[int]) -> list[int]:
        """The first ``cut`` tokens of recent sequence ``base`` (if any), then ``tail``."""
        head = self.seen[base % len(self.seen)][:cut] if self.seen else []
        ids = (head + tail)[: MAX_TOKENS - 8]
        self.seen = [*self.seen[-7:], ids]
        return ids

    # ---- valid use -----------------------------------------------------------------------------

    def slots(self, n: int) -> torch.Tensor | None:
        """``n`` slots rounded up to whole pages, evicting when short; None when still short."""
        need = -(-n // self.page) * self.page
        short = need - self.allocator.available_size()
        if short > 0:
            self.cache.evict(short)
        return self.allocator.alloc(need)

    def insert(self, ids: list[int], extra_key: Any) -> None:
        """Insert ``ids`` with fresh slots; free the duplicates and the unaligned tail's page."""
        fresh = self.slots(len(ids))
        if fresh is None:
            return
        present = self.cache.insert(RadixKey(ids, extra_key), fresh[: len(ids)])
        aligned = len(ids) - len(ids) % self.page
        spare = torch.cat([fresh[:present], fresh[aligned:]])
        if spare.numel():
            self.allocator.free(spare)

    def schedule(self, ids: list[int], extra_key: Any, kv_len: int, load: bool) -> None:
        """Admit a request for ``ids`` and compute its first ``kv_len`` tokens (if room)."""
        if not self.rows.available_size():
            return
        cache = self.cache
        match = cache.match_prefix(RadixKey(ids, extra_key))
        prefix, node = match.device_indices, match.last_device_node
        if load and match.host_hit_length:
            loaded, node = cache.init_load_back(match.last_host_node, match.host_hit_length)
            prefix = torch.cat([prefix, loaded])
        cache.inc_lock_ref(node)
        if self.host is not None:
            cache.ready_to_load_host_cache()
        (row,) = self.rows.alloc(1)
        self.rows.write((row, slice(0, len(prefix))), prefix)
        req = Req(
            row,
            list(ids),
            kv_len=len(prefix),
            extra_key=extra_key,
            prefix_indices=prefix,
            last_node=node,
            cache_protected_len=len(prefix),
        )
        self.live.append(req)
        if not self.compute(req, max(kv_len, len(prefix))):
            self.abort(req)

    def compute(self, req: Req, new_len: int) -> bool:
        """Give row positions ``[req.kv_len, new_len)`` slots: the rest of the request's last
        page, then fresh whole pages. False (nothing changed) when the device is full."""
        p, old, row = self.page, req.kv_len, req.req_pool_idx
        cap = -(-old // p) * p  # end of the request's last page
        fresh = self.slots(max(0, new_len - cap))
        if fresh is None:
            return False
        end = min(cap, new_len)
        if old < end:  # same page as position old - old % p (the request's own)
            start = int(self.rows.req_to_token[row, old - old % p])
            self.rows.write((row, slice(old, end)), torch.arange(old, end) % p + start)
        if new_len > cap:
            self.rows.write((row, slice(cap, new_len)), fresh[: new_len - cap])
        req.kv_len = new_len
        return True

    def decode(self, req: Req, token: int) -> None:
        """Compute the KV of every token that lacks it, or else sample ``token``."""
        total = len(req.origin_input_ids) + len(req.output_ids)
        if req.kv_len < total:
            self.compute(req, total)
        elif total < MAX_TOKENS:
            req.output_ids.append(token)

    def finish(self, req: Req) -> None:
        self.cache.cache_finished_req(req)
        self.live.remove(req)
        self.finished = [*self.finished[-3:], req]

    def abort(self, req: Req) -> None:
        """Drop a request without caching: free its own slots and row, release its lock."""
        self.live.remove(req)
        own = self.rows.req_to_token[req.req_pool_idx, req.cache_protected_len : req.kv_len]
        if own.numel():
            self.allocator.free(own.to(torch.int64))
        self.rows.free(req.req_pool_idx)
        self.cache.dec_lock_ref(req.last_node)

    # ---- lookups -------------------------------------------------------------------------------

    def node(self, node_id: int) -> TreeNode:
        return next(n for n in iter_nodes(self.cache) if n.id == node_id)

    def tree_slots(self) -> torch.Tensor:
        """Device slots held by tree nodes (int64, CPU), node by node."""
        held = [n.value.cpu() for n in iter_nodes(self.cache) if n.value is not None]
        return torch.cat(held) if held else torch.empty(0, dtype=torch.int64)

    def free_row(self) -> int | None:
        """A row id of the request pool that no live request holds, or None."""
        used = {req.req_pool_idx for req in self.live}
        return next((r for r in range(ROWS) if r not in used), None)

    # ---- checks --------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything a rejected call must leave unchanged, as comparable values."""
        cache = self.cache
        snap: dict[str, Any] = {
            "tree": sorted(_node_state(n) for n in iter_nodes(cache)),
            "sizes": (cache.evictable_size(), cache.protected_size(), cache.total_size()),
            "device_free": (self.allocator.available_size(), self.allocator.free_slots().tolist()),
            "rows": (self.rows.available_size(), self.rows.req_to_token.tolist()),
            "requests": [_req_state(r) for r in self.live + self.finished],
        }
        if self.host is not None:
            ctrl = cache.cache_controller
            queues = (ctrl.write_queue, ctrl.load_queue, ctrl.ack_write_queue, ctrl.ack_load_queue)
            snap["host"] = (
                cache.host_size(),
                self.host.available_size(),
                self.host.free_slots().tolist(),
                [len(q) for q in queues],
            )
        return snap

    def check(self) -> None:
        """Every component's invariants, then device-page and host-slot ownership."""
        self.cache.check_invariants()
        self.allocator.check_invariants()
        self._check_device_pages()
        if self.host is not None:
            self.host.check_invariants()
            self._check_host_slots()

    def _check_device_pages(self) -> None:
        p, num_pages = self.page, self.allocator.size // self.page
        tree = self.tree_slots()
        assert tree.numel() % p == 0, "the tree holds a partial page"
        pages = tree.view(-1, p)
        assert bool((pages[:, 0] % p == 0).all()) and torch.equal(
            pages, pages[:, :1] + torch.arange(p)
        ), "a tree node holds a misaligned page"
        owners = [("tree", pages[:, 0] // p), ("free", self.allocator.free_slots()[::p] // p)]
        table = self.rows.req_to_token
        for req in self.live:
            row = table[req.req_pool_idx].to(torch.int64)
            locked = row[: req.cache_protected_len]
            assert bool(torch.isin(locked, tree).all()), "a live request's prefix left the tree"
            own = row[req.cache_protected_len : req.kv_len] // p
            owners.append((f"request row {req.req_pool_idx}", own.unique()))
        claimed = torch.cat([ids for _, ids in owners])
        assert claimed.numel() == 0 or (
            int(claimed.min()) >= 1 and int(claimed.max()) <= num_pages
        ), "a device page out of range is owned"
        counts = torch.bincount(claimed, minlength=num_pages + 1)[1:]
        twice = (counts > 1).nonzero().flatten() + 1
        assert not twice.numel(), f"device pages {twice.tolist()} claimed twice: " + ", ".join(
            name for name, ids in owners if bool(torch.isin(ids, twice).any())
        )
        leaked = (counts == 0).nonzero().flatten() + 1
        assert not leaked.numel(), f"device pages {leaked.tolist()} leaked (free nor owned)"

    def _check_host_slots(self) -> None:
        held = [n.host_value for n in iter_nodes(self.cache) if n.host_value is not None]
        claimed = torch.cat([*held, self.host.free_slots()])
        assert claimed.numel() == claimed.unique().numel(), "a host slot is claimed twice"
        assert torch.equal(claimed.sort().values, torch.arange(self.host.size)), "host slots leak"
