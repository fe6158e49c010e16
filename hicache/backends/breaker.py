"""CircuitBreaker: stop calling a backend that fails or hangs, retry it after a back-off.

States (``state``): ``closed`` (calls go through), ``open`` (every call is refused at once: a
fast miss), ``half_open`` (the back-off has passed and one trial call is in flight; others are
refused). Closed -> open after ``failure_threshold`` consecutive failures, or at once after a
call slower than its limit (a dead server typically costs seconds per call): ``slow_call_s``
for every ``SLOW_CALL_PAGES`` pages it moves, so a large batch is not taken for a hang. The trial
call's success closes it (and resets the back-off); its failure reopens it with the back-off
doubled, up to ``max_backoff_s``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from hicache.checks import check_int

__all__ = ["CircuitBreaker"]

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
SLOW_CALL_PAGES = 64  # a call may take slow_call_s per this many pages (64 8B pages: 1 GiB)


def _check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return float(value)


class CircuitBreaker:
    """See the module docstring. Thread-safe.

    Parameters
    ----------
    failure_threshold : consecutive failures that open it (>= 1).
    slow_call_s : a call taking longer than this (per ``SLOW_CALL_PAGES`` pages, ``slow_limit``)
        counts as a failure and opens it at once.
    backoff_s : how long it stays open the first time.
    max_backoff_s : cap of the doubled back-off (>= ``backoff_s``).
    clock : seconds, monotonic; the caller times calls with the same clock (``clock``).
    """

    def __init__(
        self,
        failure_threshold: int = 3,
        slow_call_s: float = 1.0,
        backoff_s: float = 5.0,
        max_backoff_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failure_threshold = check_int("failure_threshold", failure_threshold, minimum=1)
        self.slow_call_s = _check_seconds("slow_call_s", slow_call_s)
        self.backoff_s = _check_seconds("backoff_s", backoff_s)
        self.max_backoff_s = _check_seconds("max_backoff_s", max_backoff_s)
        if self.max_backoff_s < self.backoff_s:
            raise ValueError(f"max_backoff_s must be >= backoff_s={backoff_s}, got {max_backoff_s}")
        if not callable(clock):
            raise TypeError(f"clock must be callable, got {type(clock).__name__}")
        self.clock = clock
        self._lock = threading.Lock()
        self._state = CLOSED
        self._failures = 0
        self._backoff = self.backoff_s
        self._opened_at = 0.0
        self.opened = 0  # how many times it has opened

    @property
    def state(self) -> str:
        """``closed``, ``open`` or ``half_open``."""
        with self._lock:
            return self._state

    @property
    def current_backoff_s(self) -> float:
        """The back-off of the current (or next) open period."""
        with self._lock:
            return self._backoff

    def allow(self) -> bool:
        """Whether a call may go to the backend now; after ``True`` the caller must report
        its outcome with ``record``. Open past its back-off: ``True`` once (the trial)."""
        with self._lock:
            if self._state == CLOSED:
                return True
            if self._state == OPEN and self.clock() - self._opened_at >= self._backoff:
                self._state = HALF_OPEN
                return True
            return False

    def slow_limit(self, pages: int = 1) -> float:
        """The seconds past which a call moving ``pages`` pages is slow."""
        return self.slow_call_s * max(1.0, pages / SLOW_CALL_PAGES)

    def record(self, ok: bool, elapsed_s: float, pages: int = 1) -> bool:
        """Report a call that ``allow`` let through: ``ok`` (it did not fail), how long it
        took and the pages it moved. Returns whether it counted as a failure (not ``ok``, or
        slower than ``slow_limit(pages)``)."""
        slow = elapsed_s > self.slow_limit(pages)
        failed = not ok or slow
        with self._lock:
            if not failed:
                self._failures = 0
                if self._state == HALF_OPEN:
                    self._state, self._backoff = CLOSED, self.backoff_s
                return False
            if self._state == HALF_OPEN:
                self._backoff = min(2 * self._backoff, self.max_backoff_s)
                self._open()
            elif self._state == CLOSED:
                self._failures += 1
                if self._failures >= self.failure_threshold or slow:
                    self._open()
            return True

    def _open(self) -> None:
        self._state, self._opened_at, self._failures = OPEN, self.clock(), 0
        self.opened += 1
