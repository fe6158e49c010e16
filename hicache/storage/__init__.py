"""The storage tier (L3): page objects in a store that outlives the process.

``base.HiCacheStorage`` is the backend contract; ``keys`` builds the page keys (chained page
hash, namespace, KV fingerprint, TP shard); ``pages.PageIO`` the bytes of each host page;
``config.StorageConfig`` the settings; ``factory.create_storage_backend`` a backend by name
(``memory``, ``file``, ``mooncake``).
"""

from hicache.storage.base import HiCacheStorage, HiCacheStorageExtraInfo
from hicache.storage.config import StorageConfig
from hicache.storage.factory import create_storage_backend
from hicache.storage.keys import KVFingerprint, StorageKeys, object_keys
from hicache.storage.pages import PageIO

__all__ = [
    "HiCacheStorage",
    "HiCacheStorageExtraInfo",
    "KVFingerprint",
    "PageIO",
    "StorageConfig",
    "StorageKeys",
    "create_storage_backend",
    "object_keys",
]
