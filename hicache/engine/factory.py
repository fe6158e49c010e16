"""Build a model's pools, a radix cache (device-only or hierarchical) and an engine over them."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hicache.checks import check_int
from hicache.engine.checks import check_model
from hicache.engine.config import EngineConfig
from hicache.engine.engine import Engine
from hicache.model import TinyTransformer, make_kv_pool
from hicache.pools import ReqToTokenPool, TokenToKVPoolAllocator
from hicache.radix import HiCacheConfig, RadixCacheConfig

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
    The rest are ``HiRadixCache`` options (``eviction_policy`` also applies to ``radix``).
    """

    kind: str = "radix"
    device_tokens: int = 4096
    page_size: int = 1
    max_context_len: int = 4096
    max_requests: int = 64
    eviction_policy: str = "lru"
    hicache_ratio: float = 2.0
    hicache_size_gb: float = 0.0
    write_policy: str = "write_through"
    io_backend: str = "kernel"
    mem_layout: str = "layer_first"
    load_back_threshold: int = 10
    verify: str = "off"
    verify_sample_period: int = 8

    def __post_init__(self) -> None:
        if self.kind not in CACHE_KINDS:
            raise ValueError(f"kind must be one of {CACHE_KINDS}, got {self.kind!r}")
        for name in ("device_tokens", "page_size", "max_context_len", "max_requests"):
            check_int(name, getattr(self, name), minimum=1)
        if self.device_tokens % self.page_size:
            raise ValueError(
                f"device_tokens ({self.device_tokens}) must be a multiple of page_size "
                f"({self.page_size})"
            )
        # The caches' own frozen configs validate the policies, the sizes (finite numbers) and
        # the layout/backend pair.
        RadixCacheConfig(self.page_size, self.eviction_policy)
        HiCacheConfig(**self.host_options())
        if self.hicache_ratio < 1:
            raise ValueError(f"hicache_ratio must be >= 1, got {self.hicache_ratio}")

    def host_options(self) -> dict[str, Any]:
        """The ``HiRadixCache`` host-tier keyword arguments (``HiCacheConfig``'s fields)."""
        return {f.name: getattr(self, f.name) for f in fields(HiCacheConfig)}


def _check_spec(spec: Any) -> None:
    if not isinstance(spec, CacheSpec):
        raise TypeError(f"spec must be a CacheSpec, got {type(spec).__name__}")


def build_cache(
    spec: CacheSpec, req_pool: ReqToTokenPool, allocator: TokenToKVPoolAllocator
) -> Any:
    """The radix cache ``spec`` names, over ``req_pool`` and ``allocator``."""
    _check_spec(spec)
    if spec.kind == "radix":
        from hicache.radix import RadixCache

        return RadixCache(req_pool, allocator, spec.page_size, eviction_policy=spec.eviction_policy)
    from hicache.radix import HiRadixCache

    return HiRadixCache(
        req_pool,
        allocator,
        spec.page_size,
        eviction_policy=spec.eviction_policy,
        **spec.host_options(),
    )


def build_engine(
    model: TinyTransformer, spec: CacheSpec, config: EngineConfig | None = None
) -> Engine:
    """Fresh pools on ``model.device``, the cache ``spec`` names, and an engine over them."""
    check_model(model)
    _check_spec(spec)
    kv_pool = make_kv_pool(model.cfg, spec.device_tokens, spec.page_size, model.device)
    allocator = TokenToKVPoolAllocator(spec.device_tokens, spec.page_size, model.device, kv_pool)
    # A row holds whole pages: a request of max_context_len tokens may need up to a page more.
    row_len = -(-spec.max_context_len // spec.page_size) * spec.page_size
    req_pool = ReqToTokenPool(spec.max_requests, row_len, model.device)
    cache = build_cache(spec, req_pool, allocator)
    return Engine(model, cache, req_pool, allocator, config)
