"""StorageIO: the storage tier's two I/O threads, and the operations they share with the scheduler.

The **prefetch thread** runs each ``Prefetch`` in two steps: an existence query
(``batch_exists`` in batches, stopping at the first short batch), then, only when the scheduler
hands it host slots (``read``), the reads (``batch_get_v1`` in batches, stopping at the first
failed page or when the prefetch is cancelled between batches). The **backup thread** writes
each ``Backup`` (``batch_set_v1`` in batches, stopping at the first failed page), in the order
they were queued, so parents reach storage before their children; a backup whose chain's
previous page (``after``) was not written is skipped, so a failed parent cancels its queued
children and storage never holds a page whose parent page is missing.

Threads never raise: an exception from the backend ends that operation as a miss (logged once
per type). The scheduler thread owns everything else — host slot allocation, the tree — and
reads an operation's progress only through its lock-guarded fields.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from hicache.backends.base import HiCacheStorage

__all__ = ["Backup", "Prefetch", "PrefetchState", "StorageIO"]

log = logging.getLogger(__name__)


class PrefetchState(enum.Enum):
    QUERYING = "querying"  # the thread is asking storage which pages it has
    QUERIED = "queried"  # ``hit_pages`` is known; the scheduler decides whether to read
    READING = "reading"  # the thread is reading into ``host_indices``
    DONE = "done"  # the thread will not touch the operation again


class Prefetch:
    """One request's prefetch: ``keys`` (one per page, in prefix order).

    ``hit_pages`` (set by the query) and ``completed_pages`` (the pages read so far: always a
    prefix, each page complete in its host slots once counted) are read under ``lock``.
    """

    def __init__(self, req_id: str, keys: list[str]) -> None:
        self.req_id, self.keys = req_id, keys
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.state = PrefetchState.QUERYING
        self.hit_pages = 0
        self.completed_pages = 0
        self.cancelled = False
        self.host_indices: torch.Tensor | None = None

    def progress(self) -> tuple[PrefetchState, int]:
        with self.lock:
            return self.state, self.completed_pages

    def cancel(self) -> tuple[PrefetchState, int]:
        """Stop after the batch in flight; the state and completed pages at this moment (pages
        counted now are never written again)."""
        with self.lock:
            self.cancelled = True
            if self.state is PrefetchState.QUERIED:
                self.state = PrefetchState.DONE
            return self.state, self.completed_pages


class Backup:
    """A node's pages to write: ``keys`` and their host slots (int64 CPU, whole pages);
    ``tag`` is the caller's (the node). ``written_pages``: the leading pages present after.
    ``on_done``: called with the op on the backup thread once it has run (before
    ``finished_backups`` returns it). ``after``: the page the first key chains from, as
    (the backup queued earlier that writes it, its index there); None: none in flight. Unless
    that backup wrote that page, this one writes nothing (``written_pages`` 0)."""

    def __init__(
        self,
        tag: Any,
        keys: list[str],
        host_indices: torch.Tensor,
        on_done: Callable[[Backup], None] | None = None,
        after: tuple[Backup, int] | None = None,
    ) -> None:
        self.tag, self.keys, self.host_indices = tag, keys, host_indices
        self.on_done, self.after = on_done, after
        self.written_pages = 0

    def parent_missing(self) -> bool:
        """Whether the page this backup chains from failed (backup thread: ``after`` ran)."""
        return self.after is not None and self.after[0].written_pages <= self.after[1]


class StorageIO:
    """The I/O threads over ``backend`` (host pool registered); see the module docstring.

    Parameters
    ----------
    backend : the (guarded) storage backend.
    page_size : tokens per page (slots per key).
    query_batch_pages, io_batch_pages : pages per existence query / per read or write call.
    on_read : called on the prefetch thread after each read call with ``(pages, seconds)``
        (the cost model's bandwidth sample).
    """

    def __init__(
        self,
        backend: HiCacheStorage,
        page_size: int,
        query_batch_pages: int,
        io_batch_pages: int,
        on_read: Callable[[int, float], None] | None = None,
    ) -> None:
        self.backend, self.page_size = backend, page_size
        self.query_batch, self.io_batch = query_batch_pages, io_batch_pages
        self.on_read = on_read
        self._prefetch_q: queue.Queue[Prefetch | None] = queue.Queue()
        self._backup_q: queue.Queue[Backup | None] = queue.Queue()
        self._done_backups: deque[Backup] = deque()
        self._warned: set[str] = set()
        self._threads = [
            threading.Thread(target=self._serve, args=(q, fn), name=f"hicache-{n}", daemon=True)
            for n, q, fn in (
                ("prefetch", self._prefetch_q, self._run_prefetch),
                ("backup", self._backup_q, self._run_backup),
            )
        ]
        for thread in self._threads:
            thread.start()
        self.closed = False

    # ---- the scheduler's side ----------------------------------------------------------------

    def query(self, op: Prefetch) -> None:
        """Queue ``op``'s existence query."""
        self._prefetch_q.put(op)

    def read(self, op: Prefetch, host_indices: torch.Tensor, pages: int) -> None:
        """Read ``op``'s first ``pages`` pages into ``host_indices`` (``pages * page_size``
        slots the caller reserved; they stay the operation's until it is DONE)."""
        with op.lock:
            assert op.state is PrefetchState.QUERIED, f"read of a {op.state} prefetch"
            op.host_indices, op.keys = host_indices, op.keys[:pages]
            op.state = PrefetchState.READING
        self._prefetch_q.put(op)

    def backup(self, op: Backup) -> None:
        self._backup_q.put(op)

    def finished_backups(self) -> list[Backup]:
        """The backups written since the last call, in order."""
        done = []
        while self._done_backups:
            done.append(self._done_backups.popleft())
        return done

    def drain(self) -> None:
        """Block until both threads have finished everything queued so far."""
        self._prefetch_q.join()
        self.drain_backups()

    def drain_backups(self) -> None:
        """Block until the backup thread has finished every write queued so far."""
        self._backup_q.join()

    def close(self) -> None:
        """Finish what is queued, stop the threads, close the backend (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self._prefetch_q.put(None)
        self._backup_q.put(None)
        for thread in self._threads:
            thread.join()
        self.backend.close()

    # ---- the threads -------------------------------------------------------------------------

    def _serve(self, q: queue.Queue[Any], run: Callable[[Any], None]) -> None:
        while True:
            op = q.get()
            try:
                if op is None:
                    return
                run(op)
            except Exception as exc:  # a backend bug must not kill the thread: a miss
                self._warn(exc)
            finally:
                q.task_done()

    def _warn(self, exc: Exception) -> None:
        kind = type(exc).__name__
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("storage I/O failed (%s: %s); treated as a miss", kind, exc)

    def _run_prefetch(self, op: Prefetch) -> None:
        try:
            if op.state is PrefetchState.QUERYING:
                self._query(op)
            else:
                self._read(op)
        finally:
            with op.lock:
                if op.state is PrefetchState.QUERYING:
                    op.state = PrefetchState.DONE if op.cancelled else PrefetchState.QUERIED
                elif op.state is PrefetchState.READING:
                    op.state = PrefetchState.DONE

    def _query(self, op: Prefetch) -> None:
        keys, step = op.keys, self.query_batch
        for start in range(0, len(keys), step):
            batch = keys[start : start + step]
            present = self.backend.batch_exists(batch)
            with op.lock:
                op.hit_pages += present
            if present < len(batch) or op.cancelled:
                return

    def _read(self, op: Prefetch) -> None:
        assert op.host_indices is not None
        ps, step = self.page_size, self.io_batch
        for start in range(0, len(op.keys), step):
            if op.cancelled:
                return
            batch = op.keys[start : start + step]
            began = time.monotonic()
            slots = op.host_indices[start * ps : (start + len(batch)) * ps]
            done = _leading(self.backend.batch_get_v1(batch, slots))
            seconds = time.monotonic() - began
            with op.lock:
                op.completed_pages += done
            if self.on_read is not None and done:
                self.on_read(done, seconds)
            if done < len(batch):
                return

    def _run_backup(self, op: Backup) -> None:
        ps, step = self.page_size, self.io_batch
        try:
            if op.parent_missing():
                return  # cancelled: its pages would be holes; retried with the parent
            for start in range(0, len(op.keys), step):
                batch = op.keys[start : start + step]
                slots = op.host_indices[start * ps : (start + len(batch)) * ps]
                done = _leading(self.backend.batch_set_v1(batch, slots))
                op.written_pages += done
                if done < len(batch):
                    return
        finally:
            if op.on_done is not None:
                op.on_done(op)
            self._done_backups.append(op)


def _leading(results: list[bool]) -> int:
    """How many of ``results``, from the first, are True."""
    for i, ok in enumerate(results):
        if not ok:
            return i
    return len(results)
