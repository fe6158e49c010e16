"""HiRadixCache: the radix tree over two tiers, device KV slots (L1) backed by host slots (L2).

A node holds a device copy (``value``), a host copy (``host_value``) or both. Device-resident
nodes form a root-connected subtree, so along any path the device nodes come first, then the
host-only ones (evicted from the device, still backed up). Under inclusive tiering backed-up
nodes form a root-connected subtree too; under exclusive tiering (``tiering="exclusive"``) a
node holds both copies only while a transfer reads one (``host_tier``).

The host side is a ``HostTier`` (``host_tier``) attached below the ledger; transfers go through
``cache_controller`` (a ``HiCacheController``), and a node being written or loaded stays locked
until its ack is processed. Writes queued by an insert are issued when the public call that
queued them returns (``insert``, ``cache_*_req``) or by ``check_hicache_events``; loads by
``ready_to_load_host_cache``. Finished acks are popped (never waited for) at those points.

A transfer that raises leaves its batch queued in the controller (its nodes stay locked): the
next ``check_hicache_events`` / ``ready_to_load_host_cache`` retries it, ``reset`` drops it.

Sizes: ``evictable_size``/``protected_size``/``total_size`` count **device** tokens only (a
host-only node contributes 0); ``host_size`` counts tokens with a host copy.
"""

from __future__ import annotations

from typing import Any

import torch

from hicache.backends import StorageConfig
from hicache.checks import check_int
from hicache.pools import SlotAllocator
from hicache.radix.base import ReqToTokenTable
from hicache.radix.config import HiCacheConfig, check_config
from hicache.radix.device_only import NoLowerTier
from hicache.radix.events import EventSink
from hicache.radix.match import MatchResult
from hicache.radix.node import TreeNode
from hicache.radix.radix_cache import RadixCache
from hicache.radix.slots import Slots
from hicache.radix.stats import CacheStats
from hicache.tiers.host import two_tier
from hicache.tiers.host.host_build import build_controller
from hicache.tiers.host.host_checks import check_host_tier
from hicache.tiers.host.host_link import HostLink
from hicache.tiers.host.host_tier import HostTier
from hicache.tiers.storage.storage_build import build_storage, storage_from_keywords
from hicache.tiers.storage.storage_link import StorageLink
from hicache.tiers.storage.storage_tier import StorageTier


class HiRadixCache(RadixCache):
    """Radix prefix cache with a host tier; see ``BasePrefixCache`` for the shared contract.

    Parameters
    ----------
    req_to_token_pool, page_size, eviction_policy, enable_kv_events, enable_kv_cache_events,
    event_sink : as ``RadixCache`` (KV events report every tier, storage included).
    token_to_kv_pool_allocator : ``TokenToKVPoolAllocator`` whose ``get_kvcache()`` is an
        ``MHATokenToKVPool`` or ``MLATokenToKVPool``; the host pool is built to match it.
    config : the host-tier settings as one ``HiCacheConfig``; or, SGLang-style, the keywords
    hicache_ratio, hicache_size_gb, write_policy, io_backend, mem_layout, load_back_threshold,
    verify, verify_sample_period, layers_ahead, tiering : see ``HiCacheConfig`` (page
        integrity: ``verified_load``; tiering: ``host_tier``).
        Passing ``config`` with any of these keywords set raises ``ValueError``.
    hicache_storage_backend, hicache_storage_prefetch_policy, model_name,
    storage_backend_extra_config : SGLang's storage keywords (``storage_from_keywords``);
        a named backend builds ``HiCacheConfig.storage``.

    Attributes
    ----------
    cache_controller : the ``HiCacheController`` moving KV between the tiers.
    host_tier : the ``HostTier`` (host copies, pending transfers, host-evictable leaves).
    storage_tier : the ``StorageTier`` below the host tier, or None without one.
    tiers : the chain of tiers that answers the tier calls: a ``HostLink`` over a
        ``StorageLink``, or over ``NoLowerTier`` without a storage tier.
    hi_config : the validated ``HiCacheConfig``.

    Raises ``TypeError``/``ValueError`` before allocating anything on bad settings, and
    ``ValueError`` when the host pool would hold no page (any size above, smaller than the
    device pool too, works).
    """

    def __init__(
        self,
        req_to_token_pool: ReqToTokenTable | None,
        token_to_kv_pool_allocator: SlotAllocator | None,
        page_size: int = 1,
        *,
        config: HiCacheConfig | None = None,
        hicache_ratio: float = 2.0,
        hicache_size_gb: float = 0,
        write_policy: str = "write_through",
        io_backend: str = "auto",
        mem_layout: str = "layer_first",
        eviction_policy: str = "lru",
        load_back_threshold: int = 10,
        verify: str = "off",
        verify_sample_period: int = 8,
        enable_kv_events: bool = False,
        enable_kv_cache_events: bool = False,
        event_sink: EventSink | None = None,
        hicache_storage_backend: str | None = None,
        hicache_storage_prefetch_policy: str = "timeout",
        model_name: str | None = None,
        storage_backend_extra_config: dict[str, Any] | None = None,
        tp_group: Any = None,
        layers_ahead: int | None = None,
        tiering: str = "inclusive",
    ) -> None:
        storage = storage_from_keywords(
            hicache_storage_backend,
            hicache_storage_prefetch_policy,
            model_name,
            storage_backend_extra_config,
        )
        settings = HiCacheConfig(
            hicache_ratio,
            hicache_size_gb,
            write_policy,
            io_backend,
            mem_layout,
            load_back_threshold,
            verify,
            verify_sample_period,
            storage,
            layers_ahead,
            tiering,
        )
        self.hi_config = settings if config is None else check_config(config, settings)
        super().__init__(
            req_to_token_pool,
            token_to_kv_pool_allocator,
            page_size,
            eviction_policy=eviction_policy,
            enable_kv_events=enable_kv_events,
            enable_kv_cache_events=enable_kv_cache_events,
            event_sink=event_sink,
            tp_group=tp_group,
        )
        self.cache_controller = build_controller(
            token_to_kv_pool_allocator, page_size, self.hi_config
        )
        self.host_tier = HostTier(
            self.ledger,
            self.cache_controller,
            eviction_policy,
            self.hi_config,
            self.ledger.events,
            self.tp,
        )
        self.ledger.attach(self.host_tier)
        self.storage_tier: StorageTier | None = None
        self.tiers = self._host_link(None)
        if self.hi_config.storage is not None:
            self._attach_storage(self.hi_config.storage)

    def _attach_storage(self, storage: StorageConfig, components: Any = None) -> None:
        """Chain in the storage tier of ``storage`` (``build_storage``, with ``components``)."""
        tree, host, events = self.tree, self.host_tier, self.ledger.events
        host_pool = self.cache_controller.mem_pool_host
        self.storage_tier = build_storage(
            tree, host, host_pool, storage, self._clock, events, components
        )
        self.host_tier.attach(self.storage_tier)
        self.tiers = self._host_link(self.storage_tier)

    def _host_link(self, storage: StorageTier | None) -> HostLink:
        """The chain of tiers: the host link over ``storage``'s link, or over none."""
        below = NoLowerTier(self.tree, self.device) if storage is None else StorageLink(storage)
        allocator = self.token_to_kv_pool_allocator
        assert allocator is not None  # build_controller refused None
        return HostLink(
            self.ledger,
            self.host_tier,
            self.cache_controller,
            allocator,
            self.hi_config.load_back_threshold,
            self.tp,
            self.tree_digest,
            below,
        )

    def close(self) -> None:
        """Stop the storage tier's threads and close its backend (idempotent); the cache
        keeps serving from the device and host tiers."""
        if self.storage_tier is not None:
            self.storage_tier.close()
            self.host_tier.below = None
            self.storage_tier = None
            self.tiers = self._host_link(None)

    def has_storage_tier(self) -> bool:
        return self.storage_tier is not None

    @property
    def write_policy(self) -> str:
        return self.hi_config.write_policy

    @property
    def tiering(self) -> str:
        return self.hi_config.tiering

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
        last = result.last_host_node
        if last.host_slots is None:  # else its path is backed up (or, exclusive: not here)
            self.host_tier.backup_path(last)
        return result

    def insert(self, key: Any, value: torch.Tensor | None = None, *, priority: int = 0) -> int:
        present = super().insert(key, value, priority=priority)
        self.host_tier.poll()
        return present

    def cache_finished_req(self, req: Any, *, trusted: bool = False) -> None:
        super().cache_finished_req(req, trusted=trusted)
        self.host_tier.poll()

    def cache_unfinished_req(self, req: Any, *, trusted: bool = False) -> None:
        super().cache_unfinished_req(req, trusted=trusted)
        self.host_tier.poll()

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` device tokens (fewer only when nothing is evictable).

        A backed-up leaf keeps its node as host-only; any other leaf is deleted, except under
        ``write_back``, where it and its ancestors without a host copy (exclusive tiering: it
        alone, whatever the write policy) are first backed up: the writes are issued and
        waited for (blocking) before the device copy is dropped. A leaf the host cannot take
        (even after ``evict_host``) is deleted, with any host-only nodes below it.
        """
        check_int("num_tokens", num_tokens, minimum=0)
        return two_tier.evict(self.ledger, self.host_tier, num_tokens)

    def inc_lock_ref(self, node: TreeNode) -> int:
        """As ``RadixCache.inc_lock_ref``; ``ValueError`` (no change) for a host-only node:
        load it back (``init_load_back``) and lock the node that returns."""
        if node is self.tree.root:  # a no-op (a miss, a hit all on the host)
            return 0
        if isinstance(node, TreeNode) and node.slots is None:
            host_only = f"inc_lock_ref: node {node.id} is host-only (evicted from the device)"
            raise ValueError(f"{host_only}; load it back with init_load_back first")
        return self.ledger.lock(node)

    # ---- whole tree --------------------------------------------------------------------------

    def reset(self) -> None:
        """Drop both tiers: wait for transfers in flight, free every node's device slots, clear
        the host pool. ``ValueError`` (no change) while a live request holds a lock."""
        two_tier.check_reset(self.tree, self.host_tier)
        if self.storage_tier is not None:
            self.storage_tier.clear()
        self.host_tier.clear()
        self._clear()

    def stats(self) -> CacheStats:
        own = super().stats()
        storage = None if self.storage_tier is None else self.storage_tier.stats()
        return CacheStats(
            own.prefix, own.device, self.host_tier.stats(), self.cache_controller.stats(), storage
        )

    def check_invariants(self) -> None:
        super().check_invariants()
        check_host_tier(self.host_tier, list(self.tree.nodes()))

    def _digest_flags(self, node: TreeNode) -> tuple[int, ...]:
        pinned = self.storage_tier is not None and self.storage_tier.pins(node)
        return node.slots is not None, node.host_slots is not None, pinned

    def _digest_sizes(self) -> tuple[int, ...]:
        host = self.cache_controller.mem_pool_host.available_size()
        return (*super()._digest_sizes(), self.host_size(), host)

    def host_evictable_leaves(self) -> list[TreeNode]:
        """Test-facing: the host-only leaves ``evict_host`` may take, in eviction order."""
        return list(self.host_tier.leaves)

    # ---- internals ---------------------------------------------------------------------------

    def _insert(self, key: Any, value: Slots | None, priority: int) -> tuple[int, list[TreeNode]]:
        present, path = super()._insert(key, value, priority)
        if path:
            if self.host_tier.exclusive:  # ``shed_inserted`` is a no-op otherwise
                self.host_tier.shed_inserted(path)
            self.host_tier.backup_path(path[-1], path)
        return present, path
