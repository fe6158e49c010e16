"""CallRunner: backend calls on a bounded pool of worker threads, each under a deadline.

The caller waits for a call at most ``timeout_s`` seconds. A call still queued then is cancelled (it
never runs); one still running is **abandoned**: the caller gets no result, and the worker's result
is discarded when the call finally returns. The host slots an abandoned call was given
(``held_slots``) stay the call's until it returns: the caller must not hand them to anyone else
before (a late read would write into them, a late write read them). Once every worker holds an
abandoned call, or after ``close``, further calls are refused at once (``run`` reports them as not
finished without waiting), so a hung backend costs each caller at most ``workers`` deadlines in all,
not one per call. Workers are daemon threads: a call that never returns does not keep the process
alive.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import torch

from hicache.checks import check_int

__all__ = ["CallRunner", "touches"]

T = TypeVar("T")
_Job = tuple["Future[Any]", Callable[[], Any]]


class CallRunner:
    """See the module docstring. Thread-safe.

    Parameters
    ----------
    timeout_s : the deadline of each call, seconds (finite, > 0).
    workers : worker threads (>= 1): calls that may run at once, abandoned ones included.
    name : names the threads (``hicache-<name>-<i>``).
    """

    def __init__(self, timeout_s: float, workers: int, name: str) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
            kind = type(timeout_s).__name__
            raise TypeError(f"timeout_s must be a number of seconds, got {kind}")
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be finite and > 0, got {timeout_s}")
        self.timeout_s, self.workers = float(timeout_s), check_int("workers", workers, minimum=1)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._abandoned: dict[Future[Any], torch.Tensor | None] = {}
        self._running: dict[threading.Thread, Future[Any]] = {}  # worker -> its call
        self._closed = False
        self._threads = [
            threading.Thread(target=self._serve, name=f"hicache-{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def run(self, fn: Callable[[], T], slots: torch.Tensor | None = None) -> tuple[bool, T | None]:
        """``(True, fn())`` when ``fn`` returns within the deadline (its exception propagates),
        else ``(False, None)``; ``slots``: the host slots ``fn`` reads or writes (held while it
        runs abandoned)."""
        if self._closed or self.abandoned() >= self.workers:
            return False, None  # closed, or every worker is stuck in the backend
        future: Future[T] = Future()
        self._jobs.put((future, fn))
        try:
            return True, future.result(timeout=self.timeout_s)
        except FutureTimeout:
            if not future.cancel():  # running: abandon it, keep its slots until it returns
                self._abandon(future, slots)
            return False, None

    def abandoned(self) -> int:
        """Abandoned calls still running."""
        with self._lock:
            return len(self._abandoned)

    def held_slots(self) -> torch.Tensor:
        """The host slots of the abandoned calls still running (int64, CPU; maybe empty)."""
        with self._lock:
            held = [s.reshape(-1).cpu() for s in self._abandoned.values() if s is not None]
        return torch.cat(held) if held else torch.empty(0, dtype=torch.int64)

    def close(self) -> None:
        """Stop the workers and wait (at most ``timeout_s`` in all) for those not stuck in an
        abandoned call (those end when it returns); later calls are refused (idempotent). So
        no worker of a closed runner is left running at interpreter exit, where a daemon
        thread still running aborts the process."""
        if self._closed:
            return
        self._closed = True
        for _ in range(self.workers):
            self._jobs.put(None)
        with self._lock:
            stuck = set(self._abandoned)
        deadline = time.monotonic() + self.timeout_s
        for thread in self._threads:
            if self._running.get(thread) not in stuck:
                thread.join(max(0.0, deadline - time.monotonic()))

    def _abandon(self, future: Future[Any], slots: torch.Tensor | None) -> None:
        with self._lock:
            self._abandoned[future] = slots
        future.add_done_callback(self._returned)  # at once if it has returned meanwhile

    def _returned(self, future: Future[Any]) -> None:
        with self._lock:
            self._abandoned.pop(future, None)

    def _serve(self) -> None:
        me = threading.current_thread()
        while (job := self._jobs.get()) is not None:
            future, fn = job
            if not future.set_running_or_notify_cancel():
                continue
            self._running[me] = future
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the waiting caller
                future.set_exception(exc)
            finally:
                del self._running[me]


def touches(slots: torch.Tensor | None, held: torch.Tensor) -> bool:
    """Whether any of ``slots`` (None: none) is in ``held`` (``CallRunner.held_slots``)."""
    return slots is not None and bool(held.numel()) and bool(torch.isin(slots, held).any())
