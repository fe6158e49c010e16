"""MemoryStorage: page objects in an in-process dict, for tests and single-process use.

The same semantics as every backend (``base.HiCacheStorage``): write-once pages, a page present
only when every object of it is, wrong arguments raise before any change, calls after
``close`` are misses. Nothing outlives the process. Each object is stored with its trailer
(``page_sum``); a page whose objects fail their check is a miss, counted and removed.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from hicache.backends.base import PageStore
from hicache.backends.keys import object_keys
from hicache.backends.pages import PageIO

__all__ = ["MemoryStorage"]


class MemoryStorage(PageStore):
    """Object key -> bytes, guarded by a lock (the batch calls may come from I/O threads)."""

    def __init__(self) -> None:
        super().__init__("memory store")
        self._objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def _count_present(self, pages: PageIO, keys: list[str]) -> int:
        with self._lock:
            for i, key in enumerate(keys):
                if self.closed or not self._present(key, pages.parts):
                    return i
        return len(keys)

    def _read_pages(self, pages: PageIO, keys: list[str], slots: list[int]) -> list[bool]:
        return [self._get_page(pages, key, slot) for key, slot in zip(keys, slots, strict=True)]

    def _get_page(self, pages: PageIO, key: str, slot: int) -> bool:
        names = object_keys(key, pages.parts)
        with self._lock:
            found = [self._objects.get(k) for k in names]
        data = [raw for raw in found if raw is not None and len(raw) == pages.stored_bytes]
        if self.closed or len(data) != pages.parts:
            return False
        targets, cut = pages.target(slot), pages.object_bytes
        for target, raw in zip(targets, data, strict=True):
            target[:] = np.frombuffer(raw, np.uint8, cut)
        if not self._accepted(pages, names, slot, targets, [raw[cut:] for raw in data]):
            with self._lock:  # removed, so that batch_exists stops offering it
                for name in names:
                    self._objects.pop(name, None)
            return False
        pages.commit(slot, targets)
        return True

    def _write_pages(self, pages: PageIO, keys: list[str], slots: list[int]) -> list[bool]:
        for key, slot in zip(keys, slots, strict=True):
            names = object_keys(key, pages.parts)
            with self._lock:
                if self._present(key, pages.parts):
                    continue
            data = [
                arr.tobytes() + pages.trailer(name, slot, arr)
                for name, arr in zip(names, pages.source(slot), strict=True)
            ]
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
            self.closed = True
            self._objects.clear()
