"""HiRadixCache: the radix tree over two tiers, device KV slots (L1) backed by host slots (L2).

A node holds a device copy (``value``), a host copy (``host_value``) or both. Device-resident
nodes form a root-connected subtree, and so do backed-up nodes; a host-only node (evicted from
the device, still backed up) is a leaf of the device subtree's complement, so along any path the
device nodes come first, then the host-only ones.

Transfers go through ``cache_controller`` (a ``HiCacheController``; the lock protocol is in
``host_io``): a node being written or loaded stays locked until its ack is processed. Writes
queued by an insert are issued when the public call that queued them returns (``insert``,
``cache_*_req``) or by ``check_hicache_events``; loads by ``ready_to_load_host_cache``.
Finished acks are popped (never waited for) at those points.

A transfer that raises leaves its batch queued in the controller (its nodes stay locked): the
next ``check_hicache_events`` / ``ready_to_load_host_cache`` retries it, ``reset`` drops it.

Sizes: ``evictable_size``/``protected_size``/``total_size`` count **device** tokens only (a
host-only node contributes 0); ``host_size`` counts tokens with a host copy.
"""

from __future__ import annotations

from typing import Any

import torch

from hicache.checks import check_int
from hicache.controller import HiCacheController
from hicache.radix import host_io, verified_load
from hicache.radix.base import MatchResult, ReqToTokenTable
from hicache.radix.config import HiCacheConfig, check_config
from hicache.radix.host_tier import build_host_pool, check_host_tier
from hicache.radix.invariants import iter_nodes
from hicache.radix.node import TreeNode
from hicache.radix.policies import LeafSet
from hicache.radix.radix_cache import RadixCache
from hicache.radix.slots import Slots, concat_slots, copy_slots


class HiRadixCache(RadixCache):
    """Radix prefix cache with a host tier; see ``BasePrefixCache`` for the shared contract.

    Parameters
    ----------
    req_to_token_pool, page_size, eviction_policy : as ``RadixCache``.
    token_to_kv_pool_allocator : ``TokenToKVPoolAllocator`` whose ``get_kvcache()`` is an
        ``MHATokenToKVPool`` or ``MLATokenToKVPool``; the host pool is built to match it.
    config : the host-tier settings as one ``HiCacheConfig``; or, SGLang-style, the keywords
    hicache_ratio, hicache_size_gb, write_policy, io_backend, mem_layout, load_back_threshold,
    verify, verify_sample_period : see ``HiCacheConfig`` (page integrity: ``verified_load``).
        Passing ``config`` with any of these keywords set raises ``ValueError``.

    Attributes
    ----------
    cache_controller : the ``HiCacheController`` moving KV between the tiers.
    hi_config : the validated ``HiCacheConfig``.

    Raises ``TypeError``/``ValueError`` before allocating anything on bad settings, and
    ``ValueError`` when the host pool would not be larger than the device pool.
    """

    def __init__(
        self,
        req_to_token_pool: ReqToTokenTable | None,
        token_to_kv_pool_allocator: Any,
        page_size: int = 1,
        *,
        config: HiCacheConfig | None = None,
        hicache_ratio: float = 2.0,
        hicache_size_gb: float = 0,
        write_policy: str = "write_through",
        io_backend: str = "kernel",
        mem_layout: str = "layer_first",
        eviction_policy: str = "lru",
        load_back_threshold: int = 10,
        verify: str = "off",
        verify_sample_period: int = 8,
    ) -> None:
        settings = HiCacheConfig(
            hicache_ratio,
            hicache_size_gb,
            write_policy,
            io_backend,
            mem_layout,
            load_back_threshold,
            verify,
            verify_sample_period,
        )
        self.hi_config = settings if config is None else check_config(config, settings)
        self._writing: dict[int, TreeNode] = {}  # node id -> node locked until its write ack
        self._loading: dict[int, TreeNode] = {}  # node id -> node locked until its load ack
        super().__init__(
            req_to_token_pool,
            token_to_kv_pool_allocator,
            page_size,
            eviction_policy=eviction_policy,
        )
        host_pool = build_host_pool(token_to_kv_pool_allocator, page_size, self.hi_config)
        self.cache_controller = HiCacheController(
            token_to_kv_pool_allocator,
            host_pool,
            page_size,
            write_policy=self.hi_config.write_policy,
            io_backend=self.hi_config.io_backend,
            verify=self.hi_config.verify,
            verify_sample_period=self.hi_config.verify_sample_period,
        )

    def _init_tree(self) -> None:
        super()._init_tree()
        self._host_evictable = LeafSet(self.config.eviction_policy)
        self._host_size = 0

    @property
    def write_policy(self) -> str:
        return self.hi_config.write_policy

    @property
    def integrity_failures(self) -> int:
        """Host pages found corrupt at load-back (and dropped) so far; 0 with verify='off'."""
        integrity = self.cache_controller.integrity
        return 0 if integrity is None else integrity.failures

    # ---- queries and updates ---------------------------------------------------------------

    def match_prefix(self, key: Any) -> MatchResult:
        """As ``RadixCache.match_prefix``, over device and host-only nodes.

        ``last_host_node`` is the deepest matched node (possibly host-only); ``host_hit_length``
        the tokens past ``last_device_node``. Under write-through policies, matched nodes that
        reach their hit threshold are queued for backup (issued by ``check_hicache_events``).
        """
        result = super().match_prefix(key)
        host_io.backup_path(self, result.last_host_node)
        return result

    def insert(self, key: Any, value: torch.Tensor | None = None, *, priority: int = 0) -> int:
        present = super().insert(key, value, priority=priority)
        host_io.issue_writes(self)
        return present

    def cache_finished_req(self, req: Any) -> None:
        super().cache_finished_req(req)
        host_io.issue_writes(self)

    def cache_unfinished_req(self, req: Any) -> None:
        super().cache_unfinished_req(req)
        host_io.issue_writes(self)

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` device tokens (fewer only when nothing is evictable).

        A backed-up leaf keeps its node as host-only; any other leaf is deleted, except under
        ``write_back``, where it and its ancestors without a host copy are first backed up:
        the writes are issued and waited for (blocking) before the device copy is dropped. A
        leaf the host cannot take (even after ``evict_host``) is deleted.
        """
        check_int("num_tokens", num_tokens, minimum=0)
        freed: list[Slots] = []
        evicted = queued = 0
        try:
            while evicted < num_tokens:
                node = None if evicted + queued >= num_tokens else self._evictable.pop()
                if node is None:
                    if not queued:
                        break
                    host_io.finish_writes(self)  # the written nodes come back as evictable
                    queued = 0
                elif host_io.write_back(self, node):
                    queued += len(node.key)
                else:
                    evicted += self._evict_leaf(node, freed)
            if queued:  # enough was freed meanwhile; still land the writes and unlock their nodes
                host_io.finish_writes(self)
        finally:
            self._free_device(freed)
        return evicted

    def evict_host(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` host tokens by deleting host-only leaves in policy order.

        Never touches the host copy of a node that is still on the device. Returns the host
        tokens freed (fewer than asked only when no host-only leaf is left).
        """
        check_int("num_tokens", num_tokens, minimum=0)
        freed: list[Slots] = []
        count = 0
        while count < num_tokens:
            node = self._host_evictable.pop()
            if node is None:
                break
            assert node.host_slots is not None and node.slots is None
            freed.append(node.host_slots)
            count += len(node.key)
            self._delete_leaf(node)
        self._host_size -= count
        if freed:
            self.cache_controller.evict_host(concat_slots(freed, torch.device("cpu")))
        return count

    def inc_lock_ref(self, node: TreeNode) -> int:
        """As ``RadixCache.inc_lock_ref``; ``ValueError`` (no change) for a host-only node:
        load it back (``init_load_back``) and lock the node that returns."""
        if isinstance(node, TreeNode) and node.slots is None:
            raise ValueError(
                f"inc_lock_ref: node {node.id} is host-only (evicted from the "
                "device); load it back with init_load_back first"
            )
        return self._lock(node)

    def _lock(self, node: TreeNode) -> int:
        """``inc_lock_ref`` without the device check: a load-back locks host-only nodes."""
        moved = super().inc_lock_ref(node)
        current: TreeNode | None = node
        while current is not None and current is not self.root and current.slots is None:
            self._host_evictable.discard(current)  # a locked host-only node is not host-evictable
            current = current.parent
        return moved

    def host_size(self) -> int:
        """Tokens in the tree with a host copy (including writes still in flight)."""
        return self._host_size

    # ---- load back ---------------------------------------------------------------------------

    def init_load_back(
        self, last_host_node: TreeNode, host_hit_length: int, mem_quota: int | None = None
    ) -> tuple[torch.Tensor, TreeNode]:
        """Queue the load of the host-only nodes above and including ``last_host_node``.

        Parameters
        ----------
        last_host_node : ``MatchResult.last_host_node``; must be backed up (or the root).
        host_hit_length : ``MatchResult.host_hit_length``; below ``load_back_threshold`` nothing
            is loaded (recomputing is cheaper). The whole host-only chain is loaded otherwise.
        mem_quota : most device slots the load may take, or None.

        Returns
        -------
        ``(device_indices, node)``: int64 ``[n]`` device slots of the loaded tokens (allocator
        device) and ``last_host_node``, now device-resident and locked until its load ack; or an
        empty tensor and the deepest device node above it when nothing was loaded (below the
        threshold, over ``mem_quota``, or the device short even after evicting). The bytes are
        there for a forward pass that waits on ``ready_to_load_host_cache()``'s producer index.
        A load-back that ``verify`` selects is issued and checked here (blocking); a corrupt
        page and everything after it are not returned (``verified_load``).

        Raises ``TypeError``/``ValueError`` (no change) for a node not in this tree or not backed
        up, or a bad ``host_hit_length``/``mem_quota``.
        """
        chain = host_io.host_chain(self, last_host_node)
        check_int("host_hit_length", host_hit_length, minimum=0)
        if mem_quota is not None:
            check_int("mem_quota", mem_quota, minimum=0)
        above = chain[0].parent if chain else last_host_node
        assert above is not None
        too_big = mem_quota is not None and sum(len(n.key) for n in chain) > mem_quota
        if not chain or too_big or host_hit_length < self.hi_config.load_back_threshold:
            return self._no_indices(), above
        device = host_io.load_chain(self, chain)
        if device is None:
            return self._no_indices(), above
        return verified_load.check_load(self, chain, device)

    def ready_to_load_host_cache(self) -> int:
        """Issue the queued loads (layer by layer); the producer index to ``set_consumer``, or
        -1 when nothing was queued. Finished acks are then popped without blocking."""
        producer = self.cache_controller.start_loading()
        host_io.pop_acks(self)
        return producer

    def check_hicache_events(self) -> None:
        """Issue queued writes, then pop finished write and load acks (never blocks) and unlock
        their nodes."""
        host_io.issue_writes(self)

    # ---- whole tree --------------------------------------------------------------------------

    def reset(self) -> None:
        """Drop both tiers: wait for transfers in flight, free every node's device slots, clear
        the host pool. ``ValueError`` (no change) while a live request holds a lock."""
        host_io.check_no_request_locks(self)
        self.cache_controller.reset()
        self._writing.clear()
        self._loading.clear()
        self._free_device([n.slots for n in iter_nodes(self) if n.slots is not None])
        self.cache_controller.mem_pool_host.clear()
        self._init_tree()

    def check_invariants(self) -> None:
        super().check_invariants()
        check_host_tier(self)

    # ---- internals and hooks -----------------------------------------------------------------

    def _insert(self, key: Any, value: Slots | None, priority: int) -> tuple[int, list[TreeNode]]:
        present, path = super()._insert(key, value, priority)
        if path:
            host_io.backup_path(self, path[-1])
        return present, path

    def _set_device(self, node: TreeNode, value: Slots | None) -> None:
        """Give ``node`` a device copy or drop it, keeping sizes and leaf sets in step."""
        size = len(node.key) if value is not None else -len(node.key)
        if node.lock_ref:
            self._protected_size += size
        else:
            self._evictable_size += size
        node.slots = value
        if value is not None:
            self.slot_owners.take(value)
        self._sync(node)
        assert node.parent is not None
        self._sync(node.parent)

    def _adopt(self, node: TreeNode, value: Slots | None, start: int) -> int:
        """An insert covering a host-only node gives it the caller's device slots."""
        if node.slots is not None or value is None:
            return len(node.key)
        self._set_device(node, copy_slots(value, start, start + len(node.key)))
        return 0

    def _on_hit(self, node: TreeNode, tick: int, priority: int | None = None) -> None:
        member = self._host_evictable.discard(node)
        super()._on_hit(node, tick, priority)
        if member:
            self._host_evictable.add(node)

    def _is_evictable_leaf(self, node: TreeNode) -> bool:
        return (
            node.lock_ref == 0
            and node.slots is not None
            and all(child.slots is None for child in node.children.values())
        )

    def _is_host_leaf(self, node: TreeNode) -> bool:
        return (
            node.lock_ref == 0
            and node.slots is None
            and node.host_slots is not None
            and not node.children
        )

    def _sync(self, node: TreeNode) -> None:
        super()._sync(node)
        if node is not self.root:
            self._host_evictable.put(node, self._is_host_leaf(node))

    def _evict_leaf(self, node: TreeNode, freed: list[Slots]) -> int:
        if node.host_slots is None:
            return super()._evict_leaf(node, freed)
        assert node.slots is not None
        freed.append(node.slots)
        self._set_device(node, None)
        return len(node.key)
