"""FaultLog: a storage backend's faults, counted by kind, logged once per kind and then sparingly.

A fault is anything that turned a storage call into a miss other than a plain absence: an
I/O error (kind ``io_<ERRNO>``, e.g. ``io_ENOSPC``, ``io_EROFS``, ``io_EIO``; ``io_error``
without an errno), a corrupt or truncated object (``corrupt_object``), a backend call that
raised (``backend_error``), returned a malformed result (``malformed_result``) or ran past the
breaker's ``slow_call_s`` (``slow_call``), and a breaker trip (``breaker_trip``). The first
fault of a kind is logged at once; later ones of that kind at most once per ``interval_s``,
the line saying how many were not logged since the last one.
"""

from __future__ import annotations

import errno
import logging
import math
import threading
import time
from collections.abc import Callable

__all__ = ["FaultLog", "io_kind"]

LOG_INTERVAL_S = 60.0  # a kind seen again is logged at most once per this many seconds


def io_kind(err: OSError) -> str:
    """The fault kind of an ``OSError``: ``io_`` and its errno's name, ``io_error`` without."""
    name = errno.errorcode.get(err.errno) if err.errno is not None else None
    return f"io_{name}" if name else "io_error"


class FaultLog:
    """Fault counters by kind with rate-limited warnings; thread-safe.

    Parameters
    ----------
    logger : where the warnings go.
    where : names the store in each line (e.g. ``file store /tmp/hicache``).
    interval_s : the least time between two lines of one kind (> 0).
    clock : seconds, monotonic.
    """

    def __init__(
        self,
        logger: logging.Logger,
        where: str,
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)):
            raise TypeError(f"interval_s must be a number, got {type(interval_s).__name__}")
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"interval_s must be finite and > 0, got {interval_s}")
        self.logger, self.where, self.interval_s, self.clock = logger, where, interval_s, clock
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._failures = 0
        self._logged_at: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def record(
        self, kind: str, detail: object, failed: bool = True, exc: BaseException | None = None
    ) -> None:
        """Count one fault of ``kind`` (``detail``: what happened, for the log line; ``exc``:
        its exception, whose traceback a logged line carries); ``failed``: whether it failed
        the call (``failure_count``), not only a side effect."""
        now = self.clock()
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + 1
            self._failures += failed
            last = self._logged_at.get(kind)
            if last is not None and now - last < self.interval_s:
                self._unlogged[kind] = self._unlogged.get(kind, 0) + 1
                return
            self._logged_at[kind] = now
            skipped = self._unlogged.pop(kind, 0)
        since = f"; {skipped} more since the last line" if skipped else ""
        self.logger.warning(
            "%s: %s (%s); %s (this kind logged at most once per %g s%s)",
            self.where,
            kind,
            detail,
            "treated as a miss" if failed else "the call goes on",
            self.interval_s,
            since,
            exc_info=exc,
        )

    def counts(self) -> dict[str, int]:
        """Faults so far by kind (a copy)."""
        with self._lock:
            return dict(self._counts)

    def failure_count(self) -> int:
        """Faults so far that failed their call (``guard.ReportsFailures``)."""
        with self._lock:
            return self._failures
