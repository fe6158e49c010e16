"""hicache.backends: the storage backends of the storage tier (L3), page objects in a store that
outlives the process (the tier itself is ``hicache.tiers.storage``).

``base.HiCacheStorage`` is the backend contract, ``base.PageStore`` the batch calls' one
prologue (argument checks, the closed flag) shared by the stores; ``keys`` builds the page
keys (chained page hash, namespace, KV fingerprint, TP shard); ``pages.PageIO`` the bytes of
each host page; ``config.StorageConfig`` the settings; ``factory.create_storage_backend`` a
backend by name (``memory``, ``file``, ``mooncake``); ``guard.GuardedStorage`` wraps any
backend (errors become misses, a ``breaker.CircuitBreaker``, counters); ``io`` the I/O threads;
``mooncake.MooncakeStore`` (extra ``hicache[mooncake]``) is imported from its module, never
here.
"""

from hicache.backends.base import HiCacheStorage, HiCacheStorageExtraInfo, PageStore
from hicache.backends.breaker import CircuitBreaker
from hicache.backends.config import StorageConfig
from hicache.backends.factory import create_storage_backend
from hicache.backends.file import HiCacheFile
from hicache.backends.guard import GuardedStorage, StorageStats
from hicache.backends.keys import KVFingerprint, StorageKeys, object_keys
from hicache.backends.memory import MemoryStorage
from hicache.backends.pages import PageIO

__all__ = [
    "CircuitBreaker",
    "GuardedStorage",
    "HiCacheFile",
    "HiCacheStorage",
    "HiCacheStorageExtraInfo",
    "KVFingerprint",
    "MemoryStorage",
    "PageIO",
    "PageStore",
    "StorageConfig",
    "StorageKeys",
    "StorageStats",
    "create_storage_backend",
    "object_keys",
]
