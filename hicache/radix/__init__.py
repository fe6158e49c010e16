"""hicache.radix: the radix prefix tree over KV slots; HiRadixCache adds the host tier."""

from hicache.radix.base import BasePrefixCache, MatchResult
from hicache.radix.config import HiCacheConfig, RadixCacheConfig
from hicache.radix.hiradix_cache import HiRadixCache
from hicache.radix.key import RadixKey
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
    "DeviceStats",
    "HiCacheConfig",
    "HiRadixCache",
    "HostStats",
    "MatchResult",
    "PrefixStats",
    "RadixCache",
    "RadixCacheConfig",
    "RadixKey",
    "Req",
    "TokenBuffer",
    "TreeNode",
]
