"""RadixCache: the device-tier radix tree over KV slots (contract in ``base.BasePrefixCache``).

Two collaborators own the state: ``tree`` (a ``RadixTree``: nodes, walking, splitting) and
``ledger`` (a ``Ledger``: sizes, the evictable set, locks, device copies). A node's ``key`` is
an int32 numpy array of whole pages, ``slots`` its device slots (``slots.Slots``; ``value`` is
the tensor form). ``HiRadixCache`` attaches a lower tier to the ledger; nodes without a device
copy are handled here (``match_prefix`` walks them, ``insert`` gives them the caller's slots).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch

from hicache.checks import check_int
from hicache.pools import SlotAllocator
from hicache.radix import invariants
from hicache.radix.base import BasePrefixCache, ReqToTokenTable
from hicache.radix.config import RadixCacheConfig
from hicache.radix.device_only import NoLowerTier
from hicache.radix.digest import tree_digest
from hicache.radix.events import EventSink, KVEvent, cache_events
from hicache.radix.key import RadixKey, as_radix_key, edge_ids
from hicache.radix.ledger import Ledger
from hicache.radix.match import MatchResult, match_over
from hicache.radix.node import TreeNode
from hicache.radix.ownership import SlotOwners, check_allocator, check_insert_value
from hicache.radix.req import CheckedReq, check_req, trusted_req
from hicache.radix.slots import Slots, as_tensor, concat_slots
from hicache.radix.stats import CacheStats, PrefixCounter
from hicache.radix.tier import TierChain
from hicache.radix.tree import RadixTree
from hicache.tp import as_tp_group

_PRIORITY_MIN = -(2**63)


class RadixCache(BasePrefixCache):
    """Radix prefix cache over device KV slots; see ``BasePrefixCache`` for the contract.

    Parameters
    ----------
    req_to_token_pool : ``ReqToTokenPool`` (needed by ``cache_*_req``) or None.
    token_to_kv_pool_allocator : allocator evicted slots are freed to, or None. With both None
        the tree is a pure index whose values are the token ids.
    page_size : tokens per page (>= 1); must equal the allocator's.
    eviction_policy : ``lru``, ``lfu``, ``fifo``, ``mru``, ``filo`` or ``priority``.
    disable : match nothing and cache nothing (``cache_*_req`` just free).
    enable_kv_events : publish KV events (``events``), drained by ``take_events``; off by
        default, and then no page hash is computed. ``enable_kv_cache_events`` is SGLang's name
        for the same switch (either turns events on).
    event_sink : an ``EventSink`` (e.g. ``hicache.kv_events``' ZMQ publisher) that gets the
        events instead, ``AllBlocksCleared`` first (turns them on; ``take_events`` is empty).
    tp_group : None (one rank), a ``torch.distributed`` process group or a ``hicache.tp.TPGroup``:
        the TP ranks this cache agrees with (``tp``); see ``HiRadixCache``.

    Attributes
    ----------
    tree : the ``RadixTree``; ledger : its ``Ledger``; slot_owners : the ledger's ``SlotOwners``.
    tiers : the chain of tiers below the device (``tier.TierChain``): ``NoLowerTier`` here.
    """

    def __init__(
        self,
        req_to_token_pool: ReqToTokenTable | None,
        token_to_kv_pool_allocator: SlotAllocator | None,
        page_size: int = 1,
        *,
        eviction_policy: str = "lru",
        disable: bool = False,
        enable_kv_events: bool = False,
        enable_kv_cache_events: bool = False,
        event_sink: EventSink | None = None,
        tp_group: Any = None,
    ) -> None:
        self.config = RadixCacheConfig(page_size, eviction_policy, disable)
        self.tp = as_tp_group(tp_group)
        self._event_queue, events = cache_events(
            event_sink, page_size, enable_kv_events, enable_kv_cache_events
        )
        allocator = token_to_kv_pool_allocator
        self.device = check_allocator(allocator, req_to_token_pool is not None, page_size)
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = allocator
        self.page_size, self.disable = page_size, disable
        self._clock = itertools.count(1)
        self.slot_owners = SlotOwners(allocator)  # device slots held by nodes
        self.tree = RadixTree(page_size, np.empty(0, dtype=np.int64))
        self.ledger = Ledger(
            self.tree, allocator, self.device, eviction_policy, self.slot_owners, events
        )
        self._counts = PrefixCounter()  # lookups and inserts (``stats``)
        self.tiers: TierChain = NoLowerTier(self.tree, self.device)

    @property
    def root(self) -> TreeNode:
        return self.tree.root

    root_node = root  # SGLang's name

    # ---- queries and updates ---------------------------------------------------------------

    def match_prefix(self, key: Any) -> MatchResult:
        key = key if type(key) is RadixKey else as_radix_key(key)  # the scheduler's: as is
        root = self.tree.root
        if self.disable:
            return match_over([], root, self.device)
        tokens = key.token_ids
        path = self.tree.walk(tokens, key.extra_key)[0]
        self.ledger.hit(path, next(self._clock))
        result = match_over(path, root, self.device)
        self._counts.matched(len(tokens), result.device_prefix_len, result.host_hit_length)
        return result

    def insert(self, key: Any, value: torch.Tensor | None = None, *, priority: int = 0) -> int:
        key = as_radix_key(key)
        host = check_insert_value(
            key, value, self.token_to_kv_pool_allocator, self.device, self.slot_owners, self.tree
        )
        if type(priority) is not int or priority < _PRIORITY_MIN:
            check_int("priority", priority, minimum=_PRIORITY_MIN)
        if self.disable:
            return 0
        return self._insert(key, host, priority)[0]

    def evict(self, num_tokens: int) -> int:
        check_int("num_tokens", num_tokens, minimum=0)
        return self.ledger.evict(num_tokens)

    def inc_lock_ref(self, node: TreeNode) -> int:
        return 0 if node is self.tree.root else self.ledger.lock(node)  # the root: a no-op

    def dec_lock_ref(self, node: TreeNode) -> int:
        return 0 if node is self.tree.root else self.ledger.unlock(node)  # the root: a no-op

    def evictable_size(self) -> int:
        return self.ledger.evictable_tokens

    def protected_size(self) -> int:
        return self.ledger.protected_tokens

    def total_size(self) -> int:
        return self.ledger.evictable_tokens + self.ledger.protected_tokens

    def all_values_flatten(self) -> torch.Tensor:
        """Every node's device slots, int64 ``[total_size()]`` on ``self.device``, parents
        before children (host-only nodes contribute nothing). A fresh tensor."""
        nodes = self.tree.nodes()
        return concat_slots([n.slots for n in nodes if n.slots is not None], self.device)

    def available_and_evictable_str(self) -> str:
        """One log line: free slots in the allocator plus evictable tokens (SGLang's format)."""
        allocator, evictable_size = self.token_to_kv_pool_allocator, self.evictable_size()
        available_size = 0 if allocator is None else allocator.available_size()
        total = available_size + evictable_size
        return f"Available tokens: {total} ({available_size=} + {evictable_size=})\n"

    # ---- requests ----------------------------------------------------------------------------

    def cache_finished_req(self, req: Any, *, trusted: bool = False) -> None:
        idx, row, key, present = self._check_req(req, trusted)
        if self.disable:
            self.ledger.free([row])
        else:
            self._insert_row(req, key, row, present, len(key.token_ids))
        assert self.req_to_token_pool is not None  # check_req refuses a cache without one
        self.req_to_token_pool.free(idx)
        req.req_pool_idx = None
        if req.last_node is not None:
            self.ledger.unlock(req.last_node)  # ``dec_lock_ref``'s body
            req.last_node = None

    def cache_unfinished_req(self, req: Any, *, trusted: bool = False) -> None:
        idx, row, key, present = self._check_req(req, trusted)
        if self.disable:
            req.prefix_indices = concat_slots([row], self.device)
            return
        protected, aligned = req.cache_protected_len, len(key.token_ids)
        path = self._insert_row(req, key, row, present, len(row))
        tree_indices = self._path_slots(path)
        pool = self.req_to_token_pool
        assert pool is not None  # check_req refuses a cache without one
        pool.write((idx, slice(protected, aligned)), as_tensor(tree_indices[protected:]))
        new_last = path[-1] if path else self.root
        self.inc_lock_ref(new_last)
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)
        req.prefix_indices = concat_slots([tree_indices, row[aligned:]], self.device)
        req.last_node = new_last
        req.cache_protected_len = aligned

    # ---- whole tree --------------------------------------------------------------------------

    def reset(self) -> None:
        if locked := self.ledger.protected_tokens:
            msg = f"reset: {locked} tokens are locked by live requests; "
            raise ValueError(msg + "finish or release them first")
        self._clear()

    @property
    def enable_kv_cache_events(self) -> bool:
        """Whether this cache publishes KV events (SGLang's name)."""
        return self.ledger.events is not None

    def take_events(self) -> list[KVEvent]:
        """The KV events since the last call, oldest first; empty when off or given a sink."""
        return [] if self._event_queue is None else self._event_queue.take_events()

    def pretty_print(self) -> None:
        print(invariants.format_tree(self))

    def check_invariants(self) -> None:
        nodes = invariants.check_tree(self.tree)
        invariants.check_ledger(self.ledger, nodes)

    def stats(self) -> CacheStats:
        return CacheStats(self._counts.snapshot(), self.ledger.stats())

    def tree_digest(self) -> bytes:
        """32 bytes equal on TP ranks whose trees and sizes agree (``digest.tree_digest``)."""
        return tree_digest(self.root, self._digest_flags, self._digest_sizes())

    def _digest_flags(self, node: TreeNode) -> tuple[int, ...]:
        return (node.slots is not None,)

    def _digest_sizes(self) -> tuple[int, ...]:
        allocator = self.token_to_kv_pool_allocator
        free = -1 if allocator is None else allocator.available_size()
        return self.evictable_size(), self.protected_size(), free

    def evictable_leaves(self) -> list[TreeNode]:
        """Test-facing: the device leaves ``evict`` may take, in eviction order."""
        return list(self.ledger.leaves)

    # ---- internals ---------------------------------------------------------------------------

    def _clear(self) -> None:
        """Free every node's device slots and forget them."""
        self.ledger.free([n.slots for n in self.tree.nodes() if n.slots is not None])
        self.tree.clear()
        self.ledger.clear()
        if self.ledger.events is not None:
            self.ledger.events.cleared()

    def _insert_row(
        self, req: Any, key: RadixKey, row: Slots, present: int | None, end: int
    ) -> list[TreeNode]:
        """Insert ``row``; free its slots the tree held and ``row[end:]`` (first if ``present``)."""
        protected = req.cache_protected_len
        if present is not None:
            self.ledger.free([row[protected:present], row[end:]])
        found, path = self._insert(key, row, req.priority)
        if present is None:
            self.ledger.free([row[protected:found], row[end:]])
        return path

    def _check_req(self, req: Any, trusted: bool = False) -> CheckedReq:
        pool = self.req_to_token_pool
        if trusted and pool is not None:
            return trusted_req(req, pool, self.tree)
        allocator = self.token_to_kv_pool_allocator
        return check_req(req, pool, self.tree, allocator, self.slot_owners)

    def _insert(
        self, key: RadixKey, value: Slots | None, priority: int
    ) -> tuple[int, list[TreeNode]]:
        """Insert the whole pages of ``key``; returns (tokens already cached, path). A matched
        node without a device copy takes the caller's slots (they are not duplicates)."""
        ids = key.token_ids
        path, missing = self.tree.walk(ids, key.extra_key)
        tick = next(self._clock)
        self.ledger.hit(path, tick, priority)
        present = pos = 0
        for node in path:
            end = pos + len(node.key)
            if node.slots is None and value is not None:
                self.ledger.give_device(node, value[pos:end].astype(np.int64))  # a copy
            else:
                present += end - pos
            pos = end
        if missing is not None:  # pages [pos, n) are new
            n = len(ids) - len(ids) % self.page_size
            slots = (ids if value is None else value)[pos:n].astype(np.int64)  # a copy
            parent = path[-1] if path else self.root
            leaf = TreeNode(edge_ids(ids[pos:n]), slots, parent, key.extra_key, tick, priority)
            self.ledger.add_leaf(leaf, missing)
            path.append(leaf)
        self._counts.inserted(len(ids) - len(ids) % self.page_size - present)
        return present, path

    def _path_slots(self, path: list[TreeNode]) -> Slots:
        values = [node.slots for node in path if node.slots is not None]
        assert len(values) == len(path), "path has a node without a device copy"
        return np.concatenate(values) if values else np.empty(0, dtype=np.int64)

    def _no_indices(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64, device=self.device)
