"""The storage tier (L3): page objects in a store that outlives the process.

``base.HiCacheStorage`` is the backend contract; ``keys`` builds the page keys (chained page
hash, namespace, KV fingerprint, TP shard); ``pages.PageIO`` the bytes of each host page;
``config.StorageConfig`` the settings; ``factory.create_storage_backend`` a backend by name
(``memory``, ``file``, ``mooncake``); ``guard.GuardedStorage`` wraps any backend (errors
become misses, a ``breaker.CircuitBreaker``, counters); ``mooncake.MooncakeStore`` (extra
``hicache[mooncake]``) is imported from its module, never here.
"""

from hicache.storage.base import HiCacheStorage, HiCacheStorageExtraInfo
from hicache.storage.breaker import CircuitBreaker
from hicache.storage.config import StorageConfig
from hicache.storage.factory import create_storage_backend
from hicache.storage.file import HiCacheFile
from hicache.storage.guard import GuardedStorage, StorageStats
from hicache.storage.keys import KVFingerprint, StorageKeys, object_keys
from hicache.storage.memory import MemoryStorage
from hicache.storage.pages import PageIO

__all__ = [
    "CircuitBreaker",
    "GuardedStorage",
    "HiCacheFile",
    "HiCacheStorage",
    "HiCacheStorageExtraInfo",
    "KVFingerprint",
    "MemoryStorage",
    "PageIO",
    "StorageConfig",
    "StorageKeys",
    "StorageStats",
    "create_storage_backend",
    "object_keys",
]
