"""Fanout: a batch call's pages spread over a few threads (a backend's own, for its I/O).

The file store reads a batch's pages in parallel when its objects are large: each read is
system calls that release the GIL (``open``, ``readv``) and a hash, so a few threads keep
several reads in flight where one thread waits on each in turn. Small objects are read inline:
their Python work (which holds the GIL) is then most of a read, and threads handing the GIL to
each other cost more than they overlap. Results keep the batch's order; an exception in one page
propagates to the caller as in a loop (the file store's page reads catch their own).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from hicache.checks import check_int

__all__ = ["DEFAULT_THREADS", "Fanout"]

DEFAULT_THREADS = min(4, os.cpu_count() or 1)
T = TypeVar("T")


class Fanout:
    """``map`` over at most ``threads`` threads (1: inline, no thread), named ``name-N``;
    the pool starts on the first batch of two or more items and stops at ``close``."""

    def __init__(self, threads: int, name: str) -> None:
        check_int("threads", threads, minimum=1)
        self.threads, self.name = threads, name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def map(self, fn: Callable[..., T], *items: Iterable[object], parallel: bool = True) -> list[T]:
        """``[fn(*args) for args in zip(*items)]``, computed on the threads (inline when not
        ``parallel``)."""
        args = list(zip(*items, strict=True))
        if not parallel or self.threads == 1 or len(args) < 2:
            return [fn(*a) for a in args]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.name)
            pool = self._pool
        step = -(-len(args) // self.threads)  # one contiguous chunk a thread: one future each
        chunks = [args[i : i + step] for i in range(0, len(args), step)]
        done = pool.map(lambda chunk: [fn(*a) for a in chunk], chunks)
        return [result for chunk in done for result in chunk]

    def close(self) -> None:
        """Stop the threads once their work is done (idempotent; a later ``map`` starts them
        again)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
