"""Fanout: a batch call's pages spread over a few threads (a backend's own, for its I/O).

The file store reads a batch's pages in chunks (``map_chunks``): each chunk is one call that
runs its system calls without the GIL (``file_read.read_pages``), then the chunk's checks (a
hash each, with the GIL), so a few threads keep several reads in flight where one thread waits
on each in turn, and the GIL changes hands once per chunk. Results keep the batch's order; an
exception in one chunk propagates to the caller as in a loop (the file store's reads catch
their own).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from hicache.checks import check_int

__all__ = ["DEFAULT_THREADS", "Fanout"]

DEFAULT_THREADS = min(4, os.cpu_count() or 1)
A = TypeVar("A")
T = TypeVar("T")


class Fanout:
    """``map_chunks`` over at most ``threads`` threads (1: inline, no thread), named
    ``name-N``; the pool starts on the first batch of two or more chunks and stops at
    ``close``."""

    def __init__(self, threads: int, name: str) -> None:
        check_int("threads", threads, minimum=1)
        self.threads, self.name = threads, name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def map_chunks(
        self, fn: Callable[[list[A]], list[T]], items: list[A], chunk: int, parallel: bool = True
    ) -> list[T]:
        """``fn`` of each run of ``chunk`` (>= 1) consecutive ``items`` (one result per item),
        the results in order: the chunks computed on the threads, inline when not ``parallel``
        or when there is one chunk."""
        assert chunk >= 1, f"chunk must be >= 1, got {chunk}"
        chunks = [items[i : i + chunk] for i in range(0, len(items), chunk)]
        if not parallel or self.threads == 1 or len(chunks) < 2:
            return [result for c in chunks for result in fn(c)]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.name)
            pool = self._pool
        return [result for done in pool.map(fn, chunks) for result in done]

    def close(self) -> None:
        """Stop the threads once their work is done (idempotent; a later ``map_chunks``
        starts them again)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
