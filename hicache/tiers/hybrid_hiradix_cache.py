"""HybridHiRadixCache: a hybrid model's radix tree over the device and host tiers.

``HybridRadixCache``'s components (SWA tombstones, recurrent states; ``radix.components``) on
``HiRadixCache``'s two tiers: the host KV pool of a hybrid model keeps every attention layer of a
token (``HybridKVPoolHost``), and ``HostComponents`` keeps the host copies' states (a
``MambaPoolHost``) and SWA validity, told of every copy gained or lost (``Ledger.watch``).

Protocol beside ``HybridRadixCache``'s: ``match_prefix`` runs the hybrid match over the device
and the host-only nodes (``hybrid_match``); when ``host_hit_length`` is positive, the engine
calls ``init_load_back(last_host_node, host_hit_length)``, which returns the slots of every token
past the usable device prefix (the device nodes between it and the host-only chain, then the
loaded ones) and the node whose device state (``device_state``) the request restores from; or an
empty tensor and the usable device node when nothing usable was loaded.

Tiering is inclusive (a node's host copy stays after a load-back). A storage tier (inclusive
storage tiering only) carries every component: pages hold every attention layer, a node whose
host SWA is gone breaks the chain, and the host states go beside the pages (``StateStorage``);
it is built after ``HostComponents`` (``_attach_storage``), its fingerprint naming the state
shapes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from hicache.backends import StorageConfig
from hicache.checks import check_int
from hicache.pools import MambaPoolHost
from hicache.radix.component_ledger import HybridCacheStats
from hicache.radix.components import HybridConfig, host_state_of, host_swa_gone, state_of
from hicache.radix.config import HiCacheConfig
from hicache.radix.hybrid_cache import HybridRadixCache
from hicache.radix.hybrid_match import HybridMatchResult, usable_end, window_intact
from hicache.radix.key import RadixKey
from hicache.radix.node import TreeNode
from hicache.radix.slots import Slots, concat_slots
from hicache.tiers.hiradix_cache import HiRadixCache
from hicache.tiers.host.host_checks import check_host_components
from hicache.tiers.host.host_components import HostComponents
from hicache.tiers.host.state_sums import StateSums
from hicache.tiers.storage.storage_build import storage_from_keywords


def _check_supported(kwargs: dict[str, Any]) -> None:
    """``ValueError`` for the settings a hybrid cache does not take (before any change)."""
    config = kwargs.get("config")
    tiering = kwargs.get("tiering", "inclusive") if config is None else config.tiering
    if tiering != "inclusive":
        raise ValueError(f"a hybrid model's host tier is inclusive only, got tiering={tiering!r}")
    storage = None if not isinstance(config, HiCacheConfig) else config.storage
    if storage is not None and storage.tiering != "inclusive":
        raise ValueError(
            f"a hybrid model's storage tier is inclusive only, got tiering={storage.tiering!r}"
        )


def _take_storage(kwargs: dict[str, Any]) -> StorageConfig | None:
    """The storage settings in ``kwargs``, taken out of them (the hybrid cache builds its
    storage tier once its host components exist)."""
    config = kwargs.get("config")
    if isinstance(config, HiCacheConfig):
        kwargs["config"] = dataclasses.replace(config, storage=None)
        return config.storage
    if config is not None:
        return None  # HiRadixCache refuses it
    return storage_from_keywords(
        kwargs.pop("hicache_storage_backend", None),
        kwargs.get("hicache_storage_prefetch_policy", "timeout"),
        kwargs.get("model_name"),
        kwargs.get("storage_backend_extra_config"),
    )


class HybridHiRadixCache(HybridRadixCache, HiRadixCache):
    """``HybridRadixCache`` with ``HiRadixCache``'s host tier; see the module docstring.

    Parameters
    ----------
    req_to_token_pool, token_to_kv_pool_allocator, page_size, hybrid, state_pool : as
        ``HybridRadixCache``.
    host_states : the ``MambaPoolHost`` of host states (a model with linear layers); default:
        a new one of ``host_state_slots`` slots.
    host_state_slots : host state slots of the default ``host_states``; default:
        ``hicache_ratio`` x the device state pool's slots (rounded up). A state costs
        ``MambaPoolHost.slot_bytes`` of host memory.
    **kwargs : ``HiRadixCache``'s settings (inclusive tiering; a storage tier's too).
    """

    def __init__(
        self,
        req_to_token_pool: Any,
        token_to_kv_pool_allocator: Any,
        page_size: int = 1,
        *,
        hybrid: HybridConfig,
        state_pool: Any = None,
        host_states: MambaPoolHost | None = None,
        host_state_slots: int | None = None,
        **kwargs: Any,
    ) -> None:
        _check_supported(kwargs)
        storage = _take_storage(kwargs)
        if host_state_slots is not None:
            check_int("host_state_slots", host_state_slots, minimum=1)
        if host_states is not None and not isinstance(host_states, MambaPoolHost):
            raise TypeError(
                f"host_states must be a MambaPoolHost, got {type(host_states).__name__}"
            )
        super().__init__(
            req_to_token_pool,
            token_to_kv_pool_allocator,
            page_size,
            hybrid=hybrid,
            state_pool=state_pool,
            **kwargs,
        )
        if host_states is None and self.hybrid.recurrent:
            pool = self.components.state_pool
            ratio = self.hi_config.hicache_ratio
            slots = host_state_slots or max(1, math.ceil(ratio * pool.size))
            host_states = MambaPoolHost(pool, size=slots)
        verify, period = self.hi_config.verify, self.hi_config.verify_sample_period
        sums = (
            None
            if host_states is None or verify == "off"
            else StateSums(host_states, verify, period)
        )
        self.host_components = HostComponents(
            self.components, host_states, self.ledger.events, sums
        )
        self.ledger.watch = self.host_components
        self.ledger.keep = self.host_tier.unheld  # a revived node's old slots: ``_retiring``
        if storage is not None:
            self.hi_config = dataclasses.replace(self.hi_config, storage=storage)
            self._attach_storage(storage, self.host_components)
            assert self.storage_tier is not None
            self.host_components.busy = self.storage_tier.pins

    # ---- queries -----------------------------------------------------------------------------

    def device_state(self, node: TreeNode) -> int | None:
        """The device state slot ``node`` holds (restore a request from it), or None."""
        return state_of(node.comp)

    def _matched(self, path: list[TreeNode], result: HybridMatchResult) -> None:
        if result.host_hit_length:
            self.host_components.touch(result.last_host_node)
        if path:
            self.host_tier.backup_path(path[-1])

    # ---- the host tier -----------------------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        """``HiRadixCache.evict``: a backed-up leaf keeps its node (and host state)."""
        return HiRadixCache.evict(self, num_tokens)

    def init_load_back(
        self, last_host_node: TreeNode, host_hit_length: int, mem_quota: int | None = None
    ) -> tuple[torch.Tensor, TreeNode]:
        """``HiRadixCache.init_load_back`` for a usable hybrid prefix (module docstring):
        nothing is loaded unless ``last_host_node``'s host copy has the state the model needs."""
        if not isinstance(last_host_node, TreeNode):
            raise TypeError(
                f"last_host_node must be a TreeNode, got {type(last_host_node).__name__}"
            )
        check_int("host_hit_length", host_hit_length, minimum=0)
        if mem_quota is not None:
            check_int("mem_quota", mem_quota, minimum=0)
        path = [] if last_host_node is self.root else self.tree.path_to_root(last_host_node)[::-1]
        on_device = next((i for i, n in enumerate(path) if n.slots is None), len(path))
        end = usable_end(path[:on_device], self.hybrid)
        usable = path[end] if end >= 0 else self.root
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        if on_device == len(path):
            return empty, usable  # nothing host-only: the usable device prefix is all
        if self.hybrid.recurrent and host_state_of(last_host_node.comp) is None:
            return empty, usable
        chain = path[on_device:]
        above = path[on_device - 1] if on_device else None
        if above is not None:  # its window (the gap's SWA KV) stays while SWA room is made
            self.inc_lock_ref(above)
        try:
            self._swa_room(sum(len(n.key) for n in chain))
            device, node = super().init_load_back(last_host_node, host_hit_length, mem_quota)
        finally:
            if above is not None:
                self.dec_lock_ref(above)
        if not device.numel():
            return empty, usable
        self.host_components.loaded(chain)
        if not self._usable_after_load(node):
            return empty, usable
        gap = [n.slots for n in path[end + 1 : on_device] if n.slots is not None]
        if not gap:
            return device, node
        return torch.cat([concat_slots(gap, device.device), device]), node

    def _swa_room(self, tokens: int) -> None:
        """Tombstone nodes outside every live window until the SWA pool can take ``tokens``
        (a no-op without a separate SWA pool): a load takes SWA slots with its full ones."""
        free = getattr(self.token_to_kv_pool_allocator, "swa_available_size", None)
        if free is not None and tokens > free():
            self.evict_swa(tokens - free())

    def _usable_after_load(self, node: TreeNode) -> bool:
        """Whether the loaded ``node`` ends a usable prefix: its window intact and, for a
        recurrent model, its state restored to the device."""
        path = self.tree.path_to_root(node)[::-1]
        if not window_intact(path, len(path) - 1, self.hybrid.sliding_window):
            return False
        return not self.hybrid.recurrent or self.host_components.restore_state(node)

    def _attach_state(self, key: RadixKey, slot: int) -> None:
        super()._attach_state(key, slot)
        path = self.tree.peek(key.token_ids, key.extra_key)[0]
        if not path:
            return
        had = host_state_of(path[-1].comp) is not None
        gained = self.host_components.backup_state(path[-1]) and not had
        if gained and self.storage_tier is not None:
            self.storage_tier.backups.state_gained(path[-1])

    def _retiring(self, node: TreeNode, old: Slots) -> None:
        """A pending write of ``node`` still reads ``old``: the host tier keeps them until it
        lands (``cache_*_req``'s duplicate free leaves them)."""
        self.host_tier.hold(node, old)

    def _swa_candidates(self) -> Any:
        """Nodes no transfer reads or writes: a pending write reads its node's SWA slots (and
        those of the nodes a split has put above it since), a pending load writes its chain's."""
        busy = {n.id for n in self.host_tier.writing()}
        for last in self.host_tier.pending()["load"]:
            busy.update(n.id for n in self.tree.path_to_root(last))
        return (n for n in self.tree.nodes() if n.id not in busy)

    # ---- whole tree --------------------------------------------------------------------------

    def check_invariants(self) -> None:
        super().check_invariants()
        check_host_components(self.host_components, list(self.tree.nodes()))

    def reset(self) -> None:
        super().reset()
        self.host_components.clear()

    def stats(self) -> HybridCacheStats:
        host = self.host_components.stats()
        states = None if self.storage_tier is None else self.storage_tier.states
        if states is not None:
            host = dataclasses.replace(
                host, states_stored=states.written, states_fetched=states.read
            )
        return dataclasses.replace(super().stats(), host_components=host)

    def _digest_flags(self, node: TreeNode) -> tuple[int, ...]:
        comp = node.comp
        host = (host_swa_gone(comp), host_state_of(comp) is not None)
        return (*super()._digest_flags(node), *host)
