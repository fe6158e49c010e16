"""What the engine does beyond full attention for a hybrid model (``ModelConfig.layer_pattern``
with ``S`` or ``L`` layers), served by a ``HybridRadixCache`` on the device tier, or a
``HybridHiRadixCache`` with a host tier (``CacheSpec.kind == "hiradix"``).

- Build: ``build_hybrid_parts`` makes the pools of ``make_model_pools`` and the cache over them.
- Rows: a row of a ``HybridReqToTokenPool`` comes with a fresh, zeroed state slot
  (``HybridMemory.alloc_row``; a recurrent state is evicted first when the state pool is
  full); ``restore`` copies the matched checkpoint into it (``restore_states``), so a request
  resumes exactly where the prefix ended, or from zero on a miss. After a host load-back the
  checkpoint is the loaded node's (its host state copied back to the device).
- SWA: the SWA pool can be smaller than the full one. ``HybridMemory.swa_room`` tombstones
  nodes outside every live window (``evict_swa``) before full KV is evicted, and
  ``swa_obtainable`` bounds the SWA slots admission may count on. A request's own tokens keep
  their SWA KV until the cache takes them (no ``free_swa`` of a live row).
- Checkpoints: ``HybridRadixCache.cache_*_req`` copy the row's state into a new slot as its
  ``CheckpointPolicy`` says; ``state_room`` frees one by the state LRU first when none is
  free. On CUDA the cache reads each checkpoint's slot with ``.item()`` (one host sync per
  checkpoint: at most one per finished request under the default policy).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from hicache.kv_events import make_sink
from hicache.model import TinyTransformer, make_model_pools
from hicache.pools import HybridReqToTokenPool, SWATokenToKVPoolAllocator, restore_states
from hicache.radix import CheckpointPolicy, HybridConfig, HybridRadixCache
from hicache.tiers.hybrid_hiradix_cache import HybridHiRadixCache


def hybrid_config(model: TinyTransformer, checkpoint: CheckpointPolicy) -> HybridConfig:
    """The components ``model``'s cache keeps: the window of its ``S`` layers, a state when
    it has ``L`` layers."""
    cfg = model.cfg
    window = cfg.sliding_window if cfg.layers_of("S") else None
    return HybridConfig(window, bool(cfg.layers_of("L")), checkpoint)


TOKENS_PER_STATE = 64
"""Device tokens per default checkpoint slot: a useful state ends a cached node, and a node of
chat or agent traffic spans a turn (tens to thousands of tokens), so one state per 64 tokens
keeps states for turns down to 64 tokens. Memory: ``device_tokens / 64`` slots of
``MambaStateParams.mamba_cache_per_req`` bytes each (MiBs for a real model: weigh it against
the KV pool's bytes); pass ``CacheSpec.state_slots`` to trade memory for hits."""


def default_state_slots(spec: Any) -> int:
    """``spec.max_requests`` rows' own states plus ``max(max_requests, device_tokens //
    TOKENS_PER_STATE)`` checkpoints (``spec``: a ``CacheSpec``)."""
    checkpoints = max(spec.max_requests, spec.device_tokens // TOKENS_PER_STATE)
    return spec.max_requests + checkpoints


def build_hybrid_parts(
    model: TinyTransformer, spec: Any, tp_group: Any
) -> tuple[HybridRadixCache, Any, Any]:
    """Fresh ``make_model_pools`` pools for ``model`` (its shard), sized by ``spec`` (a
    ``CacheSpec``), and a ``HybridRadixCache`` over them: the cache, its request pool and its
    allocator."""
    pools = make_model_pools(
        model.cfg,
        spec.device_tokens,
        spec.page_size,
        model.device,
        spec.max_requests,
        swa_size=spec.swa_tokens,
        state_slots=default_state_slots(spec) if spec.state_slots is None else spec.state_slots,
        shard=model.shard,
        max_context_len=spec.max_context_len,
    )
    settings: dict[str, Any] = {
        "hybrid": hybrid_config(model, spec.checkpoint),
        "eviction_policy": spec.eviction_policy,
        "tp_group": tp_group,
        "event_sink": make_sink(spec.kv_events),
    }
    if spec.host_tier is not None:
        settings["config"] = spec.host_tier
    cls = HybridRadixCache if spec.host_tier is None else HybridHiRadixCache
    cache = cls(pools.req_to_token, pools.allocator, spec.page_size, **settings)
    return cache, pools.req_to_token, pools.allocator


class HybridMemory:
    """The state-slot and SWA-slot side of ``SlotBudget`` (see the module docstring); every
    method is a no-op for what the pools lack (no state pool, no separate SWA pool)."""

    def __init__(self, cache: Any, allocator: Any, req_to_token_pool: Any) -> None:
        self.cache = cache
        self.states = (
            req_to_token_pool if isinstance(req_to_token_pool, HybridReqToTokenPool) else None
        )
        self.swa = allocator if isinstance(allocator, SWATokenToKVPoolAllocator) else None

    def alloc_row(self) -> list[int] | None:
        """One request row with its zeroed state slot; None, with nothing taken, when rows or
        state slots (after evicting one state) run out."""
        assert self.states is not None
        self.state_room()
        return self.states.alloc(1, [SimpleNamespace(req_pool_idx=None, mamba_pool_idx=None)])

    def state_room(self, finished: bool | None = None) -> None:
        """Evict one recurrent state (LRU) when the state pool has no free slot and a slot is
        wanted: for a row (``finished`` None) or for the checkpoint the policy takes in
        ``cache_finished_req`` (``finished``) or ``cache_unfinished_req``."""
        if self.states is None or self.states.mamba_pool.available_size():
            return
        policy = self.cache.hybrid.checkpoint
        if finished is None or (
            policy.at_finish if finished else policy.every_tokens is not None or policy.at_branch
        ):
            self.cache.evict_states(1)

    def restore(self, state: int | None, row: int) -> None:
        """Copy the state slot ``state`` (after the request's prefix: the match's
        ``state_slot``, or the loaded node's ``device_state``) into ``row``'s state slot."""
        if self.states is not None and state is not None:
            slot = torch.tensor([state], dtype=torch.int64)
            restore_states(self.states, slot.to(self.states.mamba_pool.device), [row])

    def swa_obtainable(self) -> int | None:
        """SWA slots free now or freed by evicting the tree's unlocked nodes (tombstoned ones
        hold none); None without a separate SWA pool."""
        if self.swa is None:
            return None
        tombstoned = self.cache.components.swa_tombstoned_tokens
        return self.swa.swa_available_size() + self.cache.evictable_size() - tombstoned

    def swa_room(self, n: int) -> None:
        """Tombstone nodes outside every live window until ``n`` SWA slots are free."""
        if self.swa is not None:
            short = n - self.swa.swa_available_size()
            if short > 0:
                self.cache.evict_swa(short)
