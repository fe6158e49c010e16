"""A hybrid model in a replay (``--layers-pattern`` with ``S`` or ``L`` layers): its settings'
checks, the recurrent-state bytes it models, and its pools and cache.

The pools are ``make_model_pools``' for a ``ModelConfig`` of the replay's geometry (one letter
per layer; ``L`` layers' states in the ``MambaPool`` of a ``HybridReqToTokenPool``) and the
cache is a ``HybridHiRadixCache`` with a host tier, a ``HybridRadixCache`` without, sized as the
engine sizes them (``engine.hybrid``): state slots ``default_state_slots`` unless given, the
SWA pool as large as the full one, host state slots ``host_ratio`` x the device's.

The replay's own states are tiny (its geometry); what a state of the modelled model costs is
``state_bytes`` (``--state-bytes``), charged by the report and the cost model per state.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import torch

from hicache.bench.checks import check_layers_pattern
from hicache.bench.model_flags import parse_checkpoint
from hicache.engine.hybrid import default_state_slots
from hicache.kv_events import make_sink
from hicache.model import ModelConfig, make_model_pools
from hicache.pools import MambaStateParams
from hicache.radix import HybridConfig, HybridRadixCache
from hicache.stack import KVStack
from hicache.tiers.hybrid_hiradix_cache import HybridHiRadixCache

STATE_MODELS = {  # name: one request's recurrent state (README, the pools' table)
    "qwen3-next-80b": MambaStateParams(
        layers=[i for i in range(48) if i % 4 != 3],  # 36 GDN layers, every 4th is attention
        conv=[(8192, 3)],
        temporal=(32, 128, 128),
    ),
}
DEFAULT_STATE_MODEL = "qwen3-next-80b"


def state_bytes_of(value: int | str) -> int:
    """``--state-bytes``: a byte count (digits) or a name of ``STATE_MODELS`` (its
    ``mamba_cache_per_req``); ``ValueError`` naming the flag otherwise."""
    text = str(value).strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    if text in STATE_MODELS:
        return STATE_MODELS[text].mamba_cache_per_req
    raise ValueError(
        f"--state-bytes must be a positive byte count or one of {sorted(STATE_MODELS)}, "
        f"got {value!r}"
    )


def check_hybrid(cfg: Any) -> None:
    """The hybrid settings of ``cfg`` (a ``ReplayConfig``), each error naming its flag."""
    check_layers_pattern(cfg.layers_pattern, cfg.layers)
    if isinstance(cfg.window, bool) or not isinstance(cfg.window, int) or cfg.window < 1:
        raise ValueError(f"--window must be a positive int, got {cfg.window!r}")
    if isinstance(cfg.state_bytes, bool) or not isinstance(cfg.state_bytes, int):
        raise TypeError(f"--state-bytes must be an int, got {type(cfg.state_bytes).__name__}")
    state_bytes_of(cfg.state_bytes)
    every = parse_checkpoint(cfg.checkpoint).every_tokens
    if every is not None and every % cfg.page_size:
        raise ValueError(f"--checkpoint every:{every} must be a multiple of --page-size")
    if cfg.state_slots is not None and cfg.state_slots < 2 * cfg.max_requests:
        raise ValueError(
            f"--state-slots must be >= {2 * cfg.max_requests} (2 x (--max-running + 1): each "
            f"request's own state and the one it resumed from), got {cfg.state_slots}"
        )
    if not cfg.hybrid:
        return
    if cfg.storage != "none" and cfg.storage_tiering != "inclusive":
        raise ValueError(
            f"--storage-tiering {cfg.storage_tiering}: a hybrid model's storage tier is "
            "inclusive only"
        )
    if cfg.tiering != "inclusive":
        raise ValueError(f"--tiering {cfg.tiering}: a hybrid model's host tier is inclusive only")


def model_config(cfg: Any) -> ModelConfig:
    """The ``ModelConfig`` whose pools hold ``cfg``'s geometry (a ``ReplayConfig``)."""
    return ModelConfig(
        num_layers=cfg.layers,
        num_heads=cfg.kv_heads,
        num_kv_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        dtype=getattr(torch, cfg.dtype),
        layer_pattern=cfg.layers_pattern or "",
        sliding_window=cfg.window,
    )


def state_slots(cfg: Any) -> int:
    """Device state slots: ``--state-slots``, else the engine's ``default_state_slots``."""
    if cfg.state_slots is not None:
        return int(cfg.state_slots)
    spec = SimpleNamespace(max_requests=cfg.max_requests, device_tokens=cfg.device_slots)
    return default_state_slots(spec)


def build_hybrid_stack(
    cfg: Any, max_context_len: int, kv_events: Any = None, storage_root: str | None = None
) -> KVStack:
    """``cfg``'s hybrid pools and cache (module docstring) as a ``KVStack``, its file store
    under ``storage_root``; the SWA allocator of an ``F`` + ``S`` model duck-types the
    allocator calls the replay makes."""
    model = model_config(cfg)
    pools = make_model_pools(
        model,
        cfg.device_slots,
        cfg.page_size,
        cfg.device,
        cfg.max_requests,
        state_slots=state_slots(cfg) if model.layers_of("L") else None,
        max_context_len=max_context_len,
    )
    window = cfg.window if model.layers_of("S") else None
    hybrid = HybridConfig(window, bool(model.layers_of("L")), parse_checkpoint(cfg.checkpoint))
    sink = make_sink(kv_events)
    settings: dict[str, Any] = {"hybrid": hybrid, "eviction_policy": cfg.eviction_policy}
    hicache = cfg.hicache(storage_root)
    if hicache is not None:
        settings["config"] = hicache
    cls = HybridRadixCache if hicache is None else HybridHiRadixCache
    cache = cls(pools.req_to_token, pools.allocator, cfg.page_size, event_sink=sink, **settings)
    allocator = cast(Any, pools.allocator)
    return KVStack(pools.kv, allocator, pools.req_to_token, cache, sink, sink is not kv_events)
