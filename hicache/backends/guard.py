"""GuardedStorage: any backend, made safe to call from an I/O thread, with counters.

It is itself a ``HiCacheStorage``. Arguments are checked here (a caller bug still raises
``TypeError``/``ValueError``); then every exception from the backend is caught, counted as a
failure and turned into a miss, and so is a malformed result (``None``, a list of the wrong
length) and a miss the backend itself counted as a failure (``ReportsFailures``). Faults are
also counted by kind (``faults.FaultLog``: one log line per kind, then at most one per
interval), with those of a ``ReportsFaults`` backend (the file store's I/O errors and corrupt
objects). With a ``CircuitBreaker`` a call the open breaker refuses returns a miss at once
without reaching the backend, and a failed or slow call counts against the breaker. With a
``CallRunner`` every backend call runs on its worker threads under its deadline: a call past it
is a miss counted as a timeout (a failure, fault kind ``timeout``), its result discarded when it
returns; the host slots it holds meanwhile are ``held_slots()``. ``stats()`` reads the counters
(thread-safe) as a ``StorageStats``, with a duration histogram per call kind and the store's
usage as of the last write.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any, TypeVar

import torch

from hicache.backends.base import HiCacheStorage, HiCacheStorageExtraInfo
from hicache.backends.breaker import CircuitBreaker
from hicache.backends.deadline import CallRunner
from hicache.backends.faults import FaultLog
from hicache.backends.reports import (
    ReportsFailures,
    ReportsFaults,
    check_bools,
    check_count,
    failures_of,
    faults_of,
)
from hicache.backends.storage_stats import StorageStats
from hicache.durations import DurationHistogram

__all__ = ["GuardedStorage", "ReportsFailures", "ReportsFaults", "StorageStats"]

logger = logging.getLogger(__name__)
T = TypeVar("T")
_CALLS = ("batch_exists", "batch_get_v1", "batch_set_v1")  # the calls timed one by one


class GuardedStorage(HiCacheStorage):
    """``backend`` behind a guard named ``name``; see the module docstring.

    ``register_mem_pool_host`` registers the pool here and forwards it to the backend (errors
    there propagate: it is set-up, not serving). ``breaker=None``: no breaker (calls always go
    to the backend; durations timed with ``time.perf_counter``). ``runner=None``: calls run on
    the caller's thread, without a deadline.
    """

    def __init__(
        self,
        backend: HiCacheStorage,
        name: str,
        breaker: CircuitBreaker | None = None,
        runner: CallRunner | None = None,
    ) -> None:
        if not isinstance(backend, HiCacheStorage):
            raise TypeError(f"backend must be a HiCacheStorage, got {type(backend).__name__}")
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        if breaker is not None and not isinstance(breaker, CircuitBreaker):
            raise TypeError(f"breaker must be a CircuitBreaker, got {type(breaker).__name__}")
        if runner is not None and not isinstance(runner, CallRunner):
            raise TypeError(f"runner must be a CallRunner, got {type(runner).__name__}")
        self.backend, self.name, self.breaker, self.runner = backend, name, breaker, runner
        self._clock: Callable[[], float] = breaker.clock if breaker else time.perf_counter
        self._lock = threading.Lock()
        self._stats = StorageStats(backend=name)
        self.faults = FaultLog(logger, f"storage {name}")
        self._trips_seen = 0  # breaker trips already counted in ``faults``
        self._page_bytes = 0
        self._durations = {what: DurationHistogram() for what in _CALLS}
        self._usage: dict[str, int | None] = {}

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        pages = self.page_io()
        self._page_bytes = pages.object_bytes * pages.parts
        self.backend.register_mem_pool_host(mem_pool_host)
        self._read_usage()

    # -- machinery ------------------------------------------------------------------------------

    def _add(self, **deltas: float) -> None:
        with self._lock:
            self._stats = replace(
                self._stats, **{k: getattr(self._stats, k) + v for k, v in deltas.items()}
            )

    def _call(
        self,
        what: str,
        fn: Callable[[], T],
        check: Callable[[T], T | None],
        pages: int,
        slots: Any = None,
    ) -> tuple[T | None, float]:
        """``check(fn())`` and its duration, or ``(None, 0.0)`` when refused, raised, timed
        out or malformed; feeds the breaker (``pages``: the pages the call covers) and the
        failure counter. ``slots``: the host slots ``fn`` uses."""
        if self.breaker is not None and not self.breaker.allow():
            self._add(refused=1)
            return None, 0.0
        before = failures_of(self.backend)
        start = self._clock()
        try:
            finished, raw = self._run(what, fn, slots)
            result = check(raw) if finished else None  # type: ignore[arg-type]
            if finished and result is None:
                self.faults.record("malformed_result", f"{what} returned a malformed result")
        except Exception as exc:
            result = None
            self._log(what, exc)
        elapsed = self._clock() - start
        self._durations[what].observe(elapsed)
        failed = result is None or failures_of(self.backend) > before
        if self.breaker is not None:
            failed = self._judge(what, failed, elapsed, pages)
        if failed:
            self._add(failures=1)
        return result, elapsed

    def _run(
        self, what: str, fn: Callable[[], T], slots: torch.Tensor | None
    ) -> tuple[bool, T | None]:
        """``fn`` under the runner's deadline (or at once without a runner): whether it
        finished, and its result; a call that did not finish is logged and counted."""
        if self.runner is None:
            return True, fn()
        finished, result = self.runner.run(fn, slots)
        if not finished:
            self._add(timeouts=1)
            deadline = self.runner.timeout_s
            self.faults.record("timeout", f"{what} did not return within {deadline} s")
        return finished, result

    def held_slots(self) -> torch.Tensor:
        """Host slots of timed-out calls still running in the backend (int64 CPU, maybe
        empty): not to be reused until they return."""
        if self.runner is None:
            return torch.empty(0, dtype=torch.int64)
        return self.runner.held_slots()

    def _judge(self, what: str, failed: bool, elapsed: float, pages: int) -> bool:
        """Report a call to the breaker; count a slow call and any trip it caused as faults.
        Whether the call counts as failed."""
        assert self.breaker is not None
        counted = self.breaker.record(not failed, elapsed, pages)
        if counted and not failed:
            limit = self.breaker.slow_limit(pages)
            self.faults.record("slow_call", f"{what} took {elapsed:.3g} s (> {limit:g} s)")
        with self._lock:
            trips, self._trips_seen = self.breaker.opened - self._trips_seen, self.breaker.opened
        for _ in range(trips):
            backoff = self.breaker.current_backoff_s
            self.faults.record("breaker_trip", f"after {what}; calls refused for {backoff:g} s")
        return counted

    def _log(self, what: str, exc: Exception) -> None:
        self.faults.record("backend_error", f"{what} raised {exc!r}", exc=exc)

    # -- the contract ---------------------------------------------------------------------------

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise TypeError("keys must be a list of str")
        self.page_io()
        found, _ = self._call(
            "batch_exists",
            lambda: self.backend.batch_exists(keys, extra_info),
            lambda r: check_count(r, len(keys)),
            len(keys),
        )
        self._add(queries=1, query_pages=len(keys), hit_pages=found or 0)
        return found or 0

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        done, n, elapsed = self._pages("batch_get_v1", keys, host_indices, extra_info)
        self._add(pages_read=n, bytes_read=n * self._page_bytes, read_seconds=elapsed)
        return done

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        done, n, elapsed = self._pages("batch_set_v1", keys, host_indices, extra_info)
        self._add(pages_written=n, bytes_written=n * self._page_bytes, write_seconds=elapsed)
        if n:
            self._read_usage()
        return done

    def _pages(
        self,
        what: str,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None,
    ) -> tuple[list[bool], int, float]:
        """Run the backend's ``what`` (``batch_get_v1``/``batch_set_v1``) guarded: the per-page
        results (all False on a failure), the pages done and the seconds it took."""
        self.page_io().page_slots(keys, host_indices)
        if what == "batch_get_v1":  # the rows a backend's read does not set stay unchecked
            self.backend.page_io().forget(host_indices)
        method = getattr(self.backend, what)
        done, elapsed = self._call(
            what,
            lambda: method(keys, host_indices, extra_info),
            lambda r: check_bools(r, len(keys)),
            len(keys),
            host_indices,
        )
        if done is None:
            return [False] * len(keys), 0, elapsed
        return done, sum(done), elapsed

    def clear(self) -> None:
        """The backend's ``clear`` (errors and timeouts logged and counted, never raised; not
        refused)."""
        self._settled("clear", self.backend.clear)
        self._read_usage()

    def _settled(self, what: str, fn: Callable[[], object]) -> None:
        """``fn()`` under the deadline; an error or a timeout is logged and counted as a
        failure, never raised."""
        try:
            finished, _ = self._run(what, fn, None)
        except Exception as exc:
            self._log(what, exc)
            finished = False
        if not finished:
            self._add(failures=1)

    def _read_usage(self) -> None:
        figures = self._figures()
        usage = {k: figures.get(k) for k in ("bytes_used", "max_bytes")}
        with self._lock:
            self._usage = {k: v if isinstance(v, int) else None for k, v in usage.items()}

    def _figures(self) -> dict[str, Any]:
        """The backend's ``get_stats()``, ``{}`` when it raises."""
        try:
            _, figures = self._run("get_stats", self.backend.get_stats, None)
            return dict(figures or {})
        except Exception as exc:
            self._log("get_stats", exc)
            return {}

    def stats(self) -> StorageStats:
        """A snapshot of the counters, with the breaker's current state."""
        with self._lock:
            stats, usage = self._stats, self._usage
        b, d = self.breaker, {what: h.snapshot() for what, h in self._durations.items()}
        return replace(
            stats,
            faults=faults_of(self.backend, self.faults.counts()),
            breaker_state="none" if b is None else b.state,
            breaker_trips=0 if b is None else b.opened,
            exists_call_seconds=d["batch_exists"],
            get_call_seconds=d["batch_get_v1"],
            set_call_seconds=d["batch_set_v1"],
            used_bytes=usage.get("bytes_used"),
            capacity_bytes=usage.get("max_bytes"),
        )

    def get_stats(self) -> dict[str, Any]:
        """The backend's ``get_stats()`` (``{}`` if it raises) updated with ``stats()`` as a
        dict and ``read_gbps`` / ``write_gbps``."""
        figures = self._figures()
        stats = self.stats()
        figures.update(asdict(stats), read_gbps=stats.read_gbps, write_gbps=stats.write_gbps)
        return figures

    def close(self) -> None:
        """The backend's ``close`` (errors and timeouts logged and counted, never raised),
        then the runner's idle workers stop."""
        self._settled("close", self.backend.close)
        if self.runner is not None:
            self.runner.close()
