"""Checks of the engine's public input, run before any state changes (nothing is converted).

``TypeError`` for a value of the wrong type, ``ValueError`` for one out of range; every message
names the argument.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from hicache.checks import check_int
from hicache.devices import canonical_device
from hicache.engine.config import EngineConfig, check_real
from hicache.engine.hybrid import hybrid_config
from hicache.engine.request import request_namespace
from hicache.model import TinyTransformer, kv_dims
from hicache.pools import MHATokenToKVPool, MLATokenToKVPool
from hicache.radix import HybridRadixCache
from hicache.radix.key import as_token_array


class Submission(NamedTuple):
    """``Engine.submit``'s arguments, validated."""

    prompt: list[int]
    max_new_tokens: int
    namespace: Any
    cache_salt: str | None
    arrival: float | None


def check_submission(
    prompt: Any,
    max_new_tokens: Any,
    extra_key: Any,
    arrival: Any,
    vocab_size: int,
    cache_salt: Any = None,
) -> Submission:
    """Validate ``Engine.submit``'s arguments (see there); the prompt comes back as a list and
    ``extra_key`` with ``cache_salt`` as the request's namespace (``request_namespace``)."""
    try:
        ids = as_token_array(prompt)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"prompt: {exc}") from None
    if len(ids) == 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"prompt must be a non-empty sequence of token ids in [0, {vocab_size})")
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    namespace = request_namespace(extra_key, cache_salt)
    if arrival is not None:
        check_real("arrival", arrival, minimum=-math.inf)
    return Submission(ids.tolist(), max_new_tokens, namespace, cache_salt, arrival)


def check_parts(
    model: Any, cache: Any, req_to_token_pool: Any, allocator: Any, config: Any
) -> None:
    """``Engine.__init__``'s arguments fit together: the cache runs over these two pools, the
    allocator's KV pool has the model's KV geometry (its shard's), dtype and device, and the
    cache's TP group is the model's."""
    if config is not None and not isinstance(config, EngineConfig):
        raise TypeError(f"config must be an EngineConfig or None, got {type(config).__name__}")
    check_model(model)
    for name, attr, part in (
        ("req_to_token_pool", "req_to_token_pool", req_to_token_pool),
        ("allocator", "token_to_kv_pool_allocator", allocator),
    ):
        if getattr(cache, attr, None) is not part:
            raise ValueError(f"cache must run over the engine's {name} (cache.{attr})")
    if model.cfg.is_hybrid:
        _check_hybrid_cache(model, cache)
    else:
        _check_kv_pool(model, getattr(allocator, "get_kvcache", lambda: None)())
    _check_tp(model, getattr(cache, "tp", None))


def _check_tp(model: TinyTransformer, tp: Any) -> None:
    """The cache's TP group is the model shard's: the same rank of the same size."""
    shard = model.shard
    got = (getattr(tp, "rank", None), getattr(tp, "size", None))
    if got != (shard.rank, shard.size):
        raise ValueError(
            f"cache.tp must be rank {shard.rank} of {shard.size} like the model's shard, "
            f"got rank {got[0]} of {got[1]}"
        )


def check_model(model: Any) -> None:
    """``TypeError`` unless ``model`` is a ``TinyTransformer`` (the engine's model type)."""
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be a TinyTransformer, got {type(model).__name__}")


def _check_hybrid_cache(model: TinyTransformer, cache: Any) -> None:
    """A hybrid model's cache is a ``HybridRadixCache`` keeping its components
    (``hybrid_config``; the pools' own checks ran when the cache was built over them)."""
    if not isinstance(cache, HybridRadixCache):
        raise TypeError(
            f"cache must be a HybridRadixCache for layer_pattern={model.cfg.layer_pattern!r}, "
            f"got {type(cache).__name__}"
        )
    want = hybrid_config(model, cache.hybrid.checkpoint)
    if cache.hybrid != want:
        raise ValueError(f"cache.hybrid must be {want} for the model, got {cache.hybrid}")


def _check_kv_pool(model: TinyTransformer, pool: Any) -> None:
    cfg = model.cfg
    kind: type = MLATokenToKVPool if cfg.attention == "mla" else MHATokenToKVPool
    if not isinstance(pool, kind):
        raise TypeError(
            f"allocator.get_kvcache() must be an {kind.__name__} for the model's "
            f"{cfg.attention} attention, got {type(pool).__name__}"
        )
    want = {
        **kv_dims(cfg, model.shard),
        "layer_num": cfg.num_layers,
        "dtype": cfg.dtype,
        "device": canonical_device(model.device),
    }
    got = {name: getattr(pool, name) for name in want}
    if got != want:
        raise ValueError(
            f"allocator.get_kvcache() does not fit the model: it has {got}, the model needs {want}"
        )
