"""A minimal continuous-batching engine embedding hicache's radix caches."""

from hicache.engine.config import EngineConfig
from hicache.engine.engine import Engine
from hicache.engine.factory import CACHE_KINDS, CacheSpec, build_cache, build_engine
from hicache.engine.request import Request, Status

__all__ = [
    "CACHE_KINDS",
    "CacheSpec",
    "Engine",
    "EngineConfig",
    "Request",
    "Status",
    "build_cache",
    "build_engine",
]
