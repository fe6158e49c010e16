"""MemoryStorage: page objects in an in-process dict, for tests and single-process use.

The same semantics as every backend (``base.HiCacheStorage``): write-once pages, a page present
only when every object of it is, wrong arguments raise before any change, calls after
``close`` are misses. Nothing outlives the process.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from hicache.storage.base import HiCacheStorage, HiCacheStorageExtraInfo
from hicache.storage.keys import check_keys, object_keys

__all__ = ["MemoryStorage"]


class MemoryStorage(HiCacheStorage):
    """Object key -> bytes, guarded by a lock (the batch calls may come from I/O threads)."""

    def __init__(self) -> None:
        self._objects: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._closed = False

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        parts = self.page_io().parts
        check_keys(keys)
        with self._lock:
            for i, key in enumerate(keys):
                if self._closed or not self._present(key, parts):
                    return i
        return len(keys)

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        pages = self.page_io()
        slots = pages.page_slots(keys, host_indices)
        done = []
        for key, slot in zip(keys, slots, strict=True):
            with self._lock:
                data = [self._objects.get(k) for k in object_keys(key, pages.parts)]
            ok = not self._closed and all(
                d is not None and len(d) == pages.object_bytes for d in data
            )
            if ok:
                targets = pages.target(slot)
                for target, raw in zip(targets, data, strict=True):
                    target[:] = np.frombuffer(raw or b"", np.uint8)
                pages.commit(slot, targets)
            done.append(ok)
        return done

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        pages = self.page_io()
        slots = pages.page_slots(keys, host_indices)
        if self._closed:
            return [False] * len(keys)
        for key, slot in zip(keys, slots, strict=True):
            names = object_keys(key, pages.parts)
            with self._lock:
                if self._present(key, pages.parts):
                    continue
            data = [arr.tobytes() for arr in pages.source(slot)]
            with self._lock:
                for name, raw in zip(names, data, strict=True):
                    self._objects.setdefault(name, raw)  # write-once, also against a racing set
        return [True] * len(keys)

    def _present(self, key: str, parts: int) -> bool:
        return all(k in self._objects for k in object_keys(key, parts))

    def clear(self) -> None:
        with self._lock:
            self._objects.clear()

    def get_stats(self) -> dict[str, Any]:
        """``{"backend", "objects", "bytes_used"}``."""
        with self._lock:
            used = sum(len(raw) for raw in self._objects.values())
            return {"backend": "memory", "objects": len(self._objects), "bytes_used": used}

    def close(self) -> None:
        """Drop every object; later calls are misses."""
        with self._lock:
            self._closed = True
            self._objects.clear()
