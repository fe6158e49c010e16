"""HybridRadixCache: the device-tier radix tree of a hybrid model (full, SWA and linear layers).

A ``RadixCache`` whose nodes also carry the SWA and recurrent-state components
(``components``), matched by the rule of ``hybrid_match`` and accounted by a
``ComponentLedger``. Full-attention KV is kept exactly as ``RadixCache`` keeps it, so a plain
model keeps using ``RadixCache`` and pays nothing for the components.

Protocol beside ``radix.req``'s: after ``match_prefix``, the engine locks ``last_device_node``
and restores ``state_slot`` into the request's state slot (``restore_states``); the request
reads SWA KV from ``swa_window_start`` on. ``cache_*_req`` checkpoint the request's state as
``HybridConfig.checkpoint`` says (``checkpoint_states`` of its row), only where the state is
exactly at a page-aligned end (``req.kv_len`` a page multiple), or, with the request pool's
extra buffer, from the state the request last tracked at its key's end.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import torch

from hicache.checks import check_int
from hicache.pools.hybrid_req_pool import HybridReqToTokenPool
from hicache.pools.state_checkpoint import checkpoint_states, checkpoint_tracked
from hicache.radix.component_checks import check_components
from hicache.radix.component_ledger import ComponentLedger, HybridCacheStats
from hicache.radix.components import HybridConfig, is_tombstoned, state_of
from hicache.radix.hybrid_match import HybridMatchResult, hybrid_match, window_intact
from hicache.radix.key import RadixKey, as_radix_key
from hicache.radix.node import TreeNode
from hicache.radix.radix_cache import RadixCache
from hicache.radix.slots import Slots, as_tensor


class HybridRadixCache(RadixCache):
    """``RadixCache`` for a hybrid model; see the module docstring.

    Parameters
    ----------
    req_to_token_pool, token_to_kv_pool_allocator, page_size, **kwargs : as ``RadixCache``;
        the allocator is a ``SWATokenToKVPoolAllocator`` when the model has SWA layers (its
        ``free_swa`` tombstones), and the pool a ``HybridReqToTokenPool`` when it has linear
        layers (its ``mamba_pool`` holds the states).
    hybrid : the ``HybridConfig`` (window, linear layers, checkpoint policy).
    state_pool : where states live (``MambaPool``); default: ``req_to_token_pool.mamba_pool``.
    """

    def __init__(
        self,
        req_to_token_pool: Any,
        token_to_kv_pool_allocator: Any,
        page_size: int = 1,
        *,
        hybrid: HybridConfig,
        state_pool: Any = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(hybrid, HybridConfig):
            raise TypeError(f"hybrid must be a HybridConfig, got {type(hybrid).__name__}")
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size, **kwargs)
        hybrid.check_page_size(page_size)
        state_pool = self._state_pool(hybrid, req_to_token_pool, state_pool)
        self.hybrid = hybrid
        self.components = ComponentLedger(
            hybrid, state_pool, token_to_kv_pool_allocator, self.ledger.events
        )

    @staticmethod
    def _state_pool(hybrid: HybridConfig, req_pool: Any, state_pool: Any) -> Any:
        if not hybrid.recurrent:
            if state_pool is not None:
                raise ValueError("state_pool is given but hybrid.recurrent is False")
            return None
        if req_pool is not None and not isinstance(req_pool, HybridReqToTokenPool):
            raise TypeError(
                "req_to_token_pool must be a HybridReqToTokenPool for a model with linear "
                f"layers, got {type(req_pool).__name__}"
            )
        state_pool = state_pool if state_pool is not None else getattr(req_pool, "mamba_pool", None)
        if state_pool is None:
            raise ValueError("a model with linear layers needs a state_pool (a MambaPool)")
        if req_pool is not None and req_pool.mamba_pool is not state_pool:
            raise ValueError("state_pool must be req_to_token_pool.mamba_pool")
        return state_pool

    # ---- queries and updates ---------------------------------------------------------------

    def match_prefix(self, key: Any) -> HybridMatchResult:
        key = as_radix_key(key)
        if self.disable:
            return hybrid_match([], self.root, self.device, self.hybrid)
        path = self.tree.walk(key.token_ids, key.extra_key)[0]
        self.ledger.hit(path, next(self._clock))
        result = hybrid_match(path, self.root, self.device, self.hybrid)
        self.components.touch(result.last_device_node)
        self._counts.matched(len(key), result.device_prefix_len, result.host_hit_length)
        self._matched(path, result)
        return result

    def _matched(self, path: list[TreeNode], result: HybridMatchResult) -> None:
        """What a subclass with lower tiers does after a match walked ``path`` (nothing)."""

    def insert(
        self,
        key: Any,
        value: torch.Tensor | None = None,
        *,
        priority: int = 0,
        state: int | torch.Tensor | None = None,
    ) -> int:
        """``RadixCache.insert``, and with ``state`` (a state slot of ``state_pool``, an int or
        a one-element integer tensor) the state after the key's last token, which the tree owns
        from then on (it frees it when the node has one, or when no match could use it). A
        key with a state must be a non-empty whole number of pages."""
        key = as_radix_key(key)
        slot = self._check_state(key, state)
        present = super().insert(key, value, priority=priority)
        if slot is not None:
            self._attach_state(key, slot)
        return present

    def evict(self, num_tokens: int) -> int:
        """Evict full-KV leaves as ``RadixCache.evict`` does (freeing their SWA KV and states)."""
        check_int("num_tokens", num_tokens, minimum=0)
        start, evicted = time.perf_counter(), 0
        freed: list[Slots] = []
        states: list[int | None] = []
        ledger = self.ledger
        while evicted < num_tokens and (node := ledger.leaves.pop()) is not None:
            states.append(self.components.forget(node))
            evicted += ledger.evict_leaf(node, freed)
        ledger.free(freed)
        self.components.states_evicted += sum(s is not None for s in states)
        self.components.release(states)
        ledger.evictions.observe(time.perf_counter() - start)
        return evicted

    def evict_swa(self, num_tokens: int) -> int:
        """Tombstone nodes outside every live window (least recently used first) until
        ``num_tokens`` SWA tokens are freed; returns the tokens freed. Call it before ``evict``
        when the SWA pool is short: it keeps every node's full KV."""
        check_int("num_tokens", num_tokens, minimum=0)
        if self.hybrid.sliding_window is None:
            return 0
        return self.components.evict_swa(num_tokens, self._swa_candidates())

    def evict_states(self, num_states: int) -> int:
        """Free up to ``num_states`` recurrent states by their LRU (the state pool is short);
        their nodes stay, matchable through ``full_kv_hit_length``. Returns how many."""
        check_int("num_states", num_states, minimum=0)
        return self.components.evict_states(num_states)

    # ---- requests ----------------------------------------------------------------------------

    def cache_finished_req(self, req: Any, *, trusted: bool = False) -> None:
        key = self._revive(req, trusted)
        slot = self._checkpoint(req, key, self.hybrid.checkpoint.at_finish)
        try:
            super().cache_finished_req(req, trusted=trusted)
        finally:  # a failing host write raises after the insert: the state still goes on
            if slot is not None:
                self._attach_state(key, slot)

    def cache_unfinished_req(self, req: Any, *, trusted: bool = False) -> None:
        key = self._revive(req, trusted)
        policy, aligned = self.hybrid.checkpoint, len(key)
        every = policy.every_tokens
        prompt = len(req.origin_input_ids)
        boundary = prompt - prompt % self.page_size  # the prompt's last page boundary
        want = (
            (every is not None and aligned // every > req.cache_protected_len // every)
            or (policy.at_branch and getattr(req, "mamba_branching_seqlen", None) == aligned)
            or (policy.at_finish and boundary < prompt and aligned == boundary)
        )
        slot = self._checkpoint(req, key, want)
        try:
            super().cache_unfinished_req(req, trusted=trusted)
        finally:  # as in cache_finished_req
            if slot is not None:
                self._attach_state(key, slot)

    # ---- whole tree --------------------------------------------------------------------------

    def reset(self) -> None:
        super().reset()
        self.components.release(self.components.clear())

    def check_invariants(self) -> None:
        super().check_invariants()
        check_components(self.tree, self.components, self.token_to_kv_pool_allocator)

    def stats(self) -> HybridCacheStats:
        base = super().stats()
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        return HybridCacheStats(**fields, components=self.components.stats())

    def _swa_candidates(self) -> Iterator[TreeNode]:
        """The nodes ``evict_swa`` may tombstone (those outside every live window)."""
        return self.tree.nodes()

    def _digest_flags(self, node: TreeNode) -> tuple[int, ...]:
        comp = node.comp
        return (*super()._digest_flags(node), is_tombstoned(comp), state_of(comp) is not None)

    # ---- internals ---------------------------------------------------------------------------

    def _check_state(self, key: RadixKey, state: Any) -> int | None:
        """The slot ``state`` names, checked (no state change); None for None."""
        if state is None:
            return None
        if not self.hybrid.recurrent:
            raise ValueError("state is given but the model has no linear layers")
        if isinstance(state, torch.Tensor) and state.numel() == 1 and not state.is_floating_point():
            state = int(state.item())
        if isinstance(state, bool) or not isinstance(state, int):
            raise TypeError(f"state must be an int slot or a one-slot tensor, got {state!r:.60}")
        if not len(key) or len(key) % self.page_size:
            raise ValueError(
                f"a key with a state must be a non-empty multiple of page_size={self.page_size} "
                f"tokens, got {len(key)}"
            )
        pool = self.components.state_pool
        if not pool.is_allocated(state):
            raise ValueError(f"state={state} is not an allocated slot of the state pool")
        if any(n.comp is not None and n.comp.state == state for n in self.components.state_lru):
            raise ValueError(f"state={state} is already a node's state")
        return state

    def _revive(self, req: Any, trusted: bool) -> RadixKey:
        """Validate ``req``; a tombstoned node among its own positions (``cache_protected_len``
        on) takes the request's slots, whose SWA KV is live, and the row gets the node's old
        slots, which ``cache_*_req`` then frees as duplicates (``_retiring`` first). Returns the
        request's key. (Else the row would take back tree slots without SWA KV in its window.)"""
        idx, row, key, _ = self._check_req(req, trusted)
        if self.hybrid.sliding_window is None or self.disable:
            return key
        pool, pos = self.req_to_token_pool, 0
        assert pool is not None  # check_req refuses a cache without one
        for node in self.tree.peek(key.token_ids, key.extra_key)[0]:
            start, pos = pos, pos + len(node.key)
            old = node.slots
            if start >= req.cache_protected_len and is_tombstoned(node.comp) and old is not None:
                self._retiring(node, old)
                node.slots = row[start:pos].copy()
                self.slot_owners.release(old)
                self.slot_owners.take(node.slots)
                pool.write((idx, slice(start, pos)), as_tensor(old))
                self.components.revive(node)
        return key

    def _retiring(self, node: TreeNode, old: Slots) -> None:
        """What a subclass with lower tiers does before ``node`` gives up its device slots
        ``old`` for a request's (nothing)."""

    def _checkpoint(self, req: Any, key: RadixKey, want: bool) -> int | None:
        """A copy of ``req``'s row state when ``want``, the model is recurrent, the state is at
        the key's (page-aligned) end and that node has no state yet; else None. With the
        request pool's extra buffer, the state ``req`` last tracked (SGLang's
        ``mamba_last_track_seqlen``, its track slot before ``mamba_next_track_idx``) serves a
        key that ends there."""
        if not (want and self.hybrid.recurrent and not self.disable):
            return None
        if not len(key) or self._state_at(key) is not None:
            return None
        pool = self.req_to_token_pool
        assert isinstance(pool, HybridReqToTokenPool)  # __init__ checks it for a recurrent model
        if len(key) == req.kv_len:
            slots = checkpoint_states(pool, [req.req_pool_idx])
        elif pool.enable_mamba_extra_buffer and _tracked(req) == len(key):
            idx = pool.get_mamba_ping_pong_other_idx(req.mamba_next_track_idx)
            slots = checkpoint_tracked(pool, req.req_pool_idx, idx)
        else:
            return None
        return None if slots is None else int(slots[0].item())

    def _state_at(self, key: RadixKey) -> int | None:
        path, partial, _ = self.tree.peek(key.token_ids, key.extra_key)
        if partial is not None or not path or sum(len(n.key) for n in path) != len(key):
            return None
        return state_of(path[-1].comp)

    def _attach_state(self, key: RadixKey, slot: int) -> None:
        """Give the node ending at ``key``'s last token (there is one: just inserted) ``slot``."""
        path, partial, _ = self.tree.peek(key.token_ids, key.extra_key)
        if self.disable or partial is not None or not path:
            self.components.release([slot])
            return
        ok = window_intact(path, len(path) - 1, self.hybrid.sliding_window)
        self.components.put_state(path[-1], slot, ok)


def _tracked(req: Any) -> int | None:
    """The tokens ``req``'s last tracked state follows (None: none; a request type without
    decode tracking has no ``mamba_last_track_seqlen``)."""
    return getattr(req, "mamba_last_track_seqlen", None)
