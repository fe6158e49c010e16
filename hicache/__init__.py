"""hicache: a hierarchical prefix KV cache (GPU L1, pinned host L2, storage L3) for LLM serving.

The names a scheduler needs to embed the cache; everything else lives in the subpackages
(``hicache.kernels`` the transfer ops, ``hicache.pools`` the host pools and layouts,
``hicache.controller`` the transfer controller, ``hicache.radix`` the tree's internals,
``hicache.tiers`` the host and storage tiers, ``hicache.backends`` the storage backends).

``build_kv_stack`` wires a device pool, its allocator, a request pool and a cache in the
right order; the pools and caches can also be built by hand with their SGLang signatures.
"""

from hicache.backends import StorageConfig
from hicache.pools import (
    MHATokenToKVPool,
    MLATokenToKVPool,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from hicache.radix import (
    HiCacheConfig,
    MatchResult,
    RadixCache,
    RadixKey,
    Req,
    TokenBuffer,
)
from hicache.stack import KVStack, build_kv_stack
from hicache.tiers.hiradix_cache import HiRadixCache

__version__ = "0.5.0"

__all__ = [
    "HiCacheConfig",
    "HiRadixCache",
    "KVStack",
    "MHATokenToKVPool",
    "MLATokenToKVPool",
    "MatchResult",
    "RadixCache",
    "RadixKey",
    "Req",
    "ReqToTokenPool",
    "StorageConfig",
    "TokenBuffer",
    "TokenToKVPoolAllocator",
    "__version__",
    "build_kv_stack",
]
