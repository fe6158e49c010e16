"""hicache.radix: the radix prefix tree over KV slots (device tier; the host tier builds on it)."""

from hicache.radix.base import BasePrefixCache, MatchResult, RadixCacheConfig
from hicache.radix.key import RadixKey, as_radix_key, as_token_array
from hicache.radix.node import TreeNode
from hicache.radix.policies import EVICTION_POLICIES, LeafSet
from hicache.radix.radix_cache import RadixCache
from hicache.radix.req import Req

__all__ = [
    "EVICTION_POLICIES",
    "BasePrefixCache",
    "LeafSet",
    "MatchResult",
    "RadixCache",
    "RadixCacheConfig",
    "RadixKey",
    "Req",
    "TreeNode",
    "as_radix_key",
    "as_token_array",
]
