"""create_storage_backend: a backend by name, imported lazily (an optional backend's missing
package is a clear error naming the extra, not an import failure of hicache)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hicache.checks import check_choice
from hicache.storage.base import HiCacheStorage

__all__ = ["create_storage_backend"]


def create_storage_backend(
    name: str, extra_config: Mapping[str, Any] | None = None
) -> HiCacheStorage:
    """A new backend ``name`` (``memory``, ``file`` or ``mooncake``) built from
    ``extra_config``; ``ValueError`` for another name, ``ImportError`` naming the pip extra when
    the backend's package is missing."""
    check_choice("backend", name, ("memory", "file", "mooncake"))
    config = dict(extra_config or {})
    if name == "memory":
        from hicache.storage.memory import MemoryStorage

        return MemoryStorage(**config)
    if name == "file":
        from hicache.storage.file import HiCacheFile

        return HiCacheFile(**config)
    from hicache.storage.mooncake import MooncakeStore

    return MooncakeStore(**config)
