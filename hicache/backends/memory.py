"""MemoryStorage: page objects in an in-process dict, for tests and single-process use.

The same semantics as every backend (``base.HiCacheStorage``): write-once pages, a page present
only when every object of it is, wrong arguments raise before any change, calls after
``close`` are misses. Nothing outlives the process. Each object is stored with its trailer
(``page_sum``); a page whose objects fail their check is a miss, counted and removed. With
``max_bytes`` the store is an LRU of pages under that many bytes (a read or a repeated write
makes a page the newest; evicted pages are reported to ``on_evict``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from hicache.backends.base import PageStore
from hicache.backends.keys import object_keys
from hicache.backends.pages import PageIO
from hicache.checks import check_int

__all__ = ["MemoryStorage"]


class MemoryStorage(PageStore):
    """Object key -> bytes, guarded by a lock (the batch calls may come from I/O threads).

    Parameters
    ----------
    max_bytes : the cap on the bytes of stored objects (payload and trailer; >= 1), or None
        (default: no cap). A write past it evicts the least recently used pages first; a page
        larger than the cap is not stored (its write fails).
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        if max_bytes is not None:
            check_int("max_bytes", max_bytes, minimum=1)
        super().__init__("memory store")
        self.max_bytes = max_bytes
        self._objects: OrderedDict[str, bytes] = OrderedDict()  # oldest use first
        self._used = 0
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
            self._touch(names)
        data = [raw for raw in found if raw is not None and len(raw) == pages.stored_bytes]
        if self.closed or len(data) != pages.parts:
            return False
        targets, cut = pages.target(slot), pages.object_bytes
        for target, raw in zip(targets, data, strict=True):
            target[:] = np.frombuffer(raw, np.uint8, cut)
        if not self._accepted(pages, names, slot, targets, [raw[cut:] for raw in data]):
            with self._lock:  # removed, so that batch_exists stops offering it
                self._drop(names)
            return False
        pages.commit(slot, targets)
        return True

    def _write_pages(self, pages: PageIO, keys: list[str], slots: list[int]) -> list[bool]:
        done = []
        for key, slot in zip(keys, slots, strict=True):
            names = object_keys(key, pages.parts)
            with self._lock:
                if self._present(key, pages.parts):
                    self._touch(names)
                    done.append(True)
                    continue
            data = [
                arr.tobytes() + pages.trailer(name, slot, arr)
                for name, arr in zip(names, pages.source(slot), strict=True)
            ]
            with self._lock:
                done.append(self._place(names, data))
            if not done[-1]:
                break  # a prefix: a later page without this one would be a hole
        return done + [False] * (len(keys) - len(done))

    def _place(self, names: list[str], data: list[bytes]) -> bool:
        """Store one page's objects (write-once, also against a racing set), evicting the
        least recently used pages to fit the cap; False when the page alone exceeds it."""
        pairs = list(zip(names, data, strict=True))
        incoming = sum(len(raw) for name, raw in pairs if name not in self._objects)
        if self.max_bytes is not None:
            if incoming > self.max_bytes:
                return False
            self._evict(self._used + incoming - self.max_bytes, len(names))
        for name, raw in pairs:
            if name not in self._objects:
                self._objects[name] = raw
                self._used += len(raw)
        return True

    def _evict(self, nbytes: int, parts: int) -> None:
        """Remove the least recently used pages (all ``parts`` objects of each) until ``nbytes``
        are freed."""
        evicted: list[str] = []
        while nbytes > 0 and self._objects:
            page = next(iter(self._objects)).rsplit("_", 1)[0]
            nbytes -= self._drop(object_keys(page, parts))
            evicted.append(page)
        if evicted and self.on_evict is not None:
            self.on_evict(evicted)

    def _drop(self, names: list[str]) -> int:
        """Remove the objects ``names`` (those present); returns the bytes freed."""
        freed = sum(len(self._objects.pop(n, b"")) for n in names)
        self._used -= freed
        return freed

    def _touch(self, names: list[str]) -> None:
        for name in names:
            if name in self._objects:
                self._objects.move_to_end(name)

    def _present(self, key: str, parts: int) -> bool:
        return all(k in self._objects for k in object_keys(key, parts))

    def clear(self) -> None:
        with self._lock:
            self._objects.clear()
            self._used = 0

    def get_stats(self) -> dict[str, Any]:
        """``{"backend", "objects", "bytes_used"}``, and ``"max_bytes"`` when capped."""
        with self._lock:
            stats = {"backend": "memory", "objects": len(self._objects), "bytes_used": self._used}
        return stats if self.max_bytes is None else stats | {"max_bytes": self.max_bytes}

    def close(self) -> None:
        """Drop every object; later calls are misses."""
        with self._lock:
            self.closed = True
            self._objects.clear()
            self._used = 0
