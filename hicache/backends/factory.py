"""create_storage_backend: a backend by name. Mooncake is imported only when asked for (its
missing package is a clear error naming the extra, not an import failure of hicache)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hicache.backends.base import HiCacheStorage
from hicache.backends.config import BACKENDS
from hicache.backends.file import HiCacheFile
from hicache.backends.memory import MemoryStorage
from hicache.checks import check_choice

__all__ = ["create_storage_backend"]


def create_storage_backend(
    name: str, extra_config: Mapping[str, Any] | None = None
) -> HiCacheStorage:
    """A new backend ``name`` (``memory``, ``file`` or ``mooncake``) built from
    ``extra_config``; ``ValueError`` for another name, ``ImportError`` naming the pip extra when
    the backend's package is missing."""
    check_choice("backend", name, BACKENDS)
    config = dict(extra_config or {})
    if name == "memory":
        return MemoryStorage(**config)
    if name == "file":
        return HiCacheFile(**config)
    from hicache.backends.mooncake import MooncakeStore

    return MooncakeStore(**config)
