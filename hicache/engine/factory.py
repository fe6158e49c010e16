"""Build a model's pools, a radix cache (device-only or hierarchical) and an engine over them.

A hybrid model (``ModelConfig.layer_pattern`` with ``S`` or ``L`` layers) gets the pools of
``make_model_pools`` and a ``HybridRadixCache``, or with a host tier (and a storage tier) a
``HybridHiRadixCache`` (``engine.hybrid``).

Under tensor parallelism each rank calls ``build_engine`` with its shard of the model
(``TinyTransformer(cfg, device, TPShard.of(group))``): its pools hold the shard's KV and its
cache agrees with the other ranks over ``tp_group`` (default: the shard's process group).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hicache.checks import check_choice, check_int
from hicache.engine.checks import check_model
from hicache.engine.config import EngineConfig
from hicache.engine.engine import Engine
from hicache.engine.hybrid import build_hybrid_parts
from hicache.kv_events.config import check_kv_events
from hicache.model import TinyTransformer, kv_dims
from hicache.pools import ReqToTokenPool, TokenToKVPoolAllocator
from hicache.radix import CheckpointPolicy, HiCacheConfig, RadixCache, RadixCacheConfig
from hicache.stack import build_kv_stack, make_cache

CACHE_KINDS = ("radix", "hiradix")


@dataclass(frozen=True)
class CacheSpec:
    """The KV cache an engine runs with.

    Attributes
    ----------
    kind : ``"radix"`` (device-only ``RadixCache``) or ``"hiradix"`` (``HiRadixCache``, host tier).
    device_tokens : usable device KV slots (a multiple of ``page_size``).
    max_context_len : longest request (prompt + output) the engine accepts, rounded up to
        whole pages.
    max_requests : rows of the request-to-token table.
    eviction_policy : the tree's eviction order (both kinds).
    hicache : the host tier's settings, used when ``kind == "hiradix"``; its ``hicache_ratio``
        must be >= 1 (the host pool is the larger tier). Its ``storage`` (a ``StorageConfig``)
        adds the storage tier below the host, so it needs ``kind == "hiradix"``.
    kv_events : the cache's KV events, as ``build_kv_stack``'s ``kv_events``: None (off), an
        endpoint or ``KVEventsConfig`` (each engine built gets its own publisher: pass one
        ``EventSink``, e.g. ``make_sink(...)``, to share a stream between engines), or a sink.
    swa_tokens : slots of a hybrid model's sliding-window pool (``F`` with ``S`` layers; a page
        multiple); default ``device_tokens``. Nodes outside every live window give theirs back
        first when it runs short (``evict_swa``).
    state_slots : recurrent-state slots of a model with ``L`` layers: one per running request
        plus the cached checkpoints; at least ``2 * max_requests`` (each request's own and the
        one it resumed from); default ``default_state_slots`` (``max_requests`` plus one
        checkpoint per ``TOKENS_PER_STATE`` device tokens, at least ``max_requests`` of them).
        Each slot costs ``MambaStateParams.mamba_cache_per_req`` bytes of device memory. With
        decode tracking (``page_size > 1`` and ``checkpoint.at_finish``) the engine adds two
        track slots per request row (``hicache.engine.hybrid.tracks_decode``).
    checkpoint : when a hybrid model's cache keeps a recurrent state (``CheckpointPolicy``;
        default: at each request's end and at branch points, as SGLang's Mamba radix cache:
        the scheduler ends a prompt chunk at a match's ``mamba_branching_seqlen``).
    """

    kind: str = "radix"
    device_tokens: int = 4096
    page_size: int = 1
    max_context_len: int = 4096
    max_requests: int = 64
    eviction_policy: str = "lru"
    hicache: HiCacheConfig = field(default_factory=HiCacheConfig)
    kv_events: Any = None
    swa_tokens: int | None = None
    state_slots: int | None = None
    checkpoint: CheckpointPolicy = field(default_factory=lambda: CheckpointPolicy(at_branch=True))

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, CACHE_KINDS)
        for name in ("device_tokens", "page_size", "max_context_len", "max_requests"):
            check_int(name, getattr(self, name), minimum=1)
        if self.device_tokens % self.page_size:
            raise ValueError(
                f"device_tokens ({self.device_tokens}) must be a multiple of page_size "
                f"({self.page_size})"
            )
        # RadixCacheConfig validates the policy; HiCacheConfig validated its own fields.
        RadixCacheConfig(self.page_size, self.eviction_policy)
        if not isinstance(self.hicache, HiCacheConfig):
            raise TypeError(f"hicache must be a HiCacheConfig, got {type(self.hicache).__name__}")
        if self.hicache.hicache_ratio < 1:
            raise ValueError(f"hicache_ratio must be >= 1, got {self.hicache.hicache_ratio}")
        if self.kind == "radix" and self.hicache.storage is not None:
            raise ValueError("hicache.storage needs kind 'hiradix' (storage sits below the host)")
        check_kv_events(self.kv_events)
        self._check_hybrid()

    def _check_hybrid(self) -> None:
        if self.swa_tokens is not None:
            check_int("swa_tokens", self.swa_tokens, minimum=1)
            if self.swa_tokens % self.page_size:
                raise ValueError(
                    f"swa_tokens ({self.swa_tokens}) must be a multiple of page_size "
                    f"({self.page_size})"
                )
        if self.state_slots is not None:
            check_int("state_slots", self.state_slots, minimum=2 * self.max_requests)
        if not isinstance(self.checkpoint, CheckpointPolicy):
            raise TypeError(
                f"checkpoint must be a CheckpointPolicy, got {type(self.checkpoint).__name__}"
            )
        every = self.checkpoint.every_tokens
        if every is not None and every % self.page_size:
            raise ValueError(
                f"checkpoint.every_tokens ({every}) must be a multiple of page_size "
                f"({self.page_size})"
            )

    @property
    def host_tier(self) -> HiCacheConfig | None:
        """``hicache`` for a ``hiradix`` cache, None for a device-only one."""
        return self.hicache if self.kind == "hiradix" else None


def _check_spec(spec: Any) -> None:
    if not isinstance(spec, CacheSpec):
        raise TypeError(f"spec must be a CacheSpec, got {type(spec).__name__}")


def build_cache(
    spec: CacheSpec,
    req_pool: ReqToTokenPool,
    allocator: TokenToKVPoolAllocator,
    tp_group: Any = None,
) -> RadixCache:
    """The radix cache ``spec`` names, over ``req_pool`` and ``allocator``, agreeing over
    ``tp_group`` (None: one rank; a process group or a ``hicache.tp.TPGroup``)."""
    _check_spec(spec)
    return make_cache(
        req_pool,
        allocator,
        spec.page_size,
        hicache=spec.host_tier,
        eviction_policy=spec.eviction_policy,
        tp_group=tp_group,
    )


def build_engine(
    model: TinyTransformer,
    spec: CacheSpec,
    config: EngineConfig | None = None,
    tp_group: Any = None,
) -> Engine:
    """Fresh pools on ``model.device`` shaped for ``model.shard``'s KV, the cache ``spec``
    names, and an engine over them. ``tp_group``: what the cache agrees over (None: the
    shard's process group, so one rank unless the model is sharded)."""
    check_model(model)
    _check_spec(spec)
    cfg = model.cfg
    group = model.shard.group if tp_group is None else tp_group
    if cfg.is_hybrid:
        cache, req_pool, allocator = build_hybrid_parts(model, spec, group)
        return Engine(model, cache, req_pool, allocator, config)
    stack = build_kv_stack(
        layer_num=cfg.num_layers,
        dtype=cfg.dtype,
        size=spec.device_tokens,
        max_requests=spec.max_requests,
        max_context_len=spec.max_context_len,
        page_size=spec.page_size,
        device=model.device,
        hicache=spec.host_tier,
        eviction_policy=spec.eviction_policy,
        tp_group=group,
        kv_events=spec.kv_events,
        **kv_dims(cfg, model.shard),
    )
    return Engine(model, stack.cache, stack.req_to_token_pool, stack.allocator, config)
