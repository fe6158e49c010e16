"""hicache.radix: the radix prefix tree over KV slots, the device-only cache and the request glue.

``HiRadixCache`` (the tree over the device, host and storage tiers) is built on this package in
``hicache.tiers``; it is still importable from here by name, loaded on first use.
"""

from __future__ import annotations

from typing import Any

from hicache.radix.base import BasePrefixCache
from hicache.radix.components import CheckpointPolicy, HybridConfig
from hicache.radix.config import HiCacheConfig, RadixCacheConfig
from hicache.radix.hybrid_cache import HybridRadixCache
from hicache.radix.hybrid_match import HybridMatchResult
from hicache.radix.key import RadixKey
from hicache.radix.match import MatchResult
from hicache.radix.node import TreeNode
from hicache.radix.policies import EVICTION_POLICIES
from hicache.radix.radix_cache import RadixCache
from hicache.radix.req import Req
from hicache.radix.stats import CacheStats, DeviceStats, HostStats, PrefixStats
from hicache.radix.tokens import TokenBuffer

__all__ = [
    "EVICTION_POLICIES",
    "BasePrefixCache",
    "CacheStats",
    "CheckpointPolicy",
    "DeviceStats",
    "HiCacheConfig",
    "HiRadixCache",
    "HostStats",
    "HybridConfig",
    "HybridMatchResult",
    "HybridRadixCache",
    "MatchResult",
    "PrefixStats",
    "RadixCache",
    "RadixCacheConfig",
    "RadixKey",
    "Req",
    "TokenBuffer",
    "TreeNode",
]


def __getattr__(name: str) -> Any:
    """``HiRadixCache``, imported from ``hicache.tiers`` when first asked for."""
    if name == "HiRadixCache":
        from hicache.tiers.hiradix_cache import HiRadixCache

        return HiRadixCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
