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
- Decode tracking (``tracks_decode``: pages over one token and ``at_finish``): a request ends
  mid-page, and the tree keeps only its whole pages, so the state at its end is useless. Each
  row gets SGLang's two ping-pong track slots (``enable_mamba_extra_buffer``), and after every
  forward that leaves a request's tokens on a page boundary past its prompt's end the row's
  state is copied into its next track slot (``HybridMemory.track``); ``cache_finished_req``
  checkpoints the last tracked state at the request's last page boundary. Cost: two more state
  slots per request row, and one state copy per request every ``page_size`` tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from hicache.kv_events import make_sink
from hicache.model import TinyTransformer, make_model_pools
from hicache.pools import (
    HybridReqToTokenPool,
    SWATokenToKVPoolAllocator,
    restore_states,
    track_states,
)
from hicache.radix import CheckpointPolicy, HybridConfig, HybridRadixCache
from hicache.tiers.hybrid_hiradix_cache import HybridHiRadixCache


def hybrid_config(model: TinyTransformer, checkpoint: CheckpointPolicy) -> HybridConfig:
    """The components ``model``'s cache keeps: the window of its ``S`` layers, a state when
    it has ``L`` layers."""
    cfg = model.cfg
    window = cfg.sliding_window if cfg.layers_of("S") else None
    return HybridConfig(window, bool(cfg.layers_of("L")), checkpoint)


TRACK_SLOTS = 2  # a row's ping-pong track slots (``HybridReqToTokenPool``, no speculation)
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


def track_slots(spec: Any) -> int:
    """The state slots decode tracking adds for a model with ``L`` layers under ``spec`` (a
    ``CacheSpec``): ``TRACK_SLOTS`` per request row when ``spec.page_size > 1`` and
    ``spec.checkpoint.at_finish``, else 0."""
    tracked = spec.page_size > 1 and spec.checkpoint.at_finish
    return TRACK_SLOTS * spec.max_requests if tracked else 0


def tracks_decode(model: TinyTransformer, spec: Any) -> bool:
    """Whether the engine tracks ``model``'s states at page boundaries during decode (module
    docstring): it has ``L`` layers and ``track_slots(spec)`` is not 0."""
    return bool(model.cfg.layers_of("L")) and track_slots(spec) > 0


def build_hybrid_parts(
    model: TinyTransformer, spec: Any, tp_group: Any
) -> tuple[HybridRadixCache, Any, Any]:
    """Fresh ``make_model_pools`` pools for ``model`` (its shard), sized by ``spec`` (a
    ``CacheSpec``), and a ``HybridRadixCache`` over them: the cache, its request pool and its
    allocator."""
    track = tracks_decode(model, spec)
    slots = default_state_slots(spec) if spec.state_slots is None else spec.state_slots
    pools = make_model_pools(
        model.cfg,
        spec.device_tokens,
        spec.page_size,
        model.device,
        spec.max_requests,
        swa_size=spec.swa_tokens,
        state_slots=slots + (track_slots(spec) if track else 0),
        shard=model.shard,
        max_context_len=spec.max_context_len,
        enable_mamba_extra_buffer=track,
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
        self.tracking = self.states is not None and self.states.enable_mamba_extra_buffer

    def alloc_row(self) -> list[int] | None:
        """One request row with its zeroed state slot (and track slots when tracking); None,
        with nothing taken, when rows or state slots (after evicting states) run out."""
        assert self.states is not None
        self.state_room()
        held = SimpleNamespace(req_pool_idx=None, mamba_pool_idx=None)
        if self.tracking:
            held.mamba_ping_pong_track_buffer = None
        return self.states.alloc(1, [held])

    def state_room(self, finished: bool | None = None) -> None:
        """Evict recurrent states (LRU) until the slots wanted are free: a row's (``finished``
        None: its state and track slots) or the checkpoint the policy takes in
        ``cache_finished_req`` (``finished``) or ``cache_unfinished_req``."""
        if self.states is None:
            return
        policy = self.cache.hybrid.checkpoint
        if finished is None:
            want = 1 + (TRACK_SLOTS if self.tracking else 0)
        elif policy.at_finish if finished else policy.every_tokens is not None or policy.at_branch:
            want = 1
        else:
            return
        short = want - self.states.mamba_pool.available_size()
        if short > 0:
            self.cache.evict_states(short)

    def track(self, work: Sequence[tuple[Any, int]]) -> None:
        """Before a forward's results are applied: for each ``(request, tokens it computed)``
        whose tokens then end on a page boundary, at or past its prompt's end, copy its row's
        state into its next track slot (module docstring). Only while ``tracking``."""
        assert self.tracking and self.states is not None
        page = self.cache.page_size
        due = [
            (req, end)
            for req, n in work
            if (end := req.kv_len + n) % page == 0 and end >= len(req.origin_input_ids)
        ]
        if not due:
            return
        track_states(
            self.states, [r.req_pool_idx for r, _ in due], [r.mamba_next_track_idx for r, _ in due]
        )
        for req, end in due:
            req.mamba_last_track_seqlen = end
            req.mamba_next_track_idx = self.states.get_mamba_ping_pong_other_idx(
                req.mamba_next_track_idx
            )

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
