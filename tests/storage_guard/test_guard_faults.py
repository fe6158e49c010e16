"""The guard counts its faults by kind (``StorageStats.faults``) with one log line per kind:
backend errors, malformed results, slow calls and breaker trips, plus a backend's own."""

from __future__ import annotations

import logging

from hicache.backends.breaker import CircuitBreaker

from .test_guard import Clock, Fake, guarded, host_pool

__all__ = ["host_pool"]  # the fixture, shared with test_guard


class Counting(Fake):
    """A fake that counts faults of its own (``ReportsFaults``)."""

    def fault_counts(self) -> dict[str, int]:
        return {"io_EIO": 2, "backend_error": 1}


def test_errors_and_malformed_results_are_counted_by_kind(host_pool, caplog) -> None:  # type: ignore[no-untyped-def]
    fake = Fake()
    guard = guarded(host_pool, fake)
    fake.mode = "raise"
    with caplog.at_level(logging.WARNING, logger="hicache.backends.guard"):
        for _ in range(3):
            assert guard.batch_exists(["a"]) == 0
        fake.mode = "none"
        assert guard.batch_exists(["a"]) == 0
    assert guard.stats().faults == {"backend_error": 3, "malformed_result": 1}
    kinds = [r.getMessage().split(": ")[1].split(" ")[0] for r in caplog.records]
    assert kinds == ["backend_error", "malformed_result"]


def test_slow_calls_and_breaker_trips_are_counted(host_pool) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=5, slow_call_s=1.0, backoff_s=5.0, clock=clock)
    fake = Fake(clock, delay=2.0)  # every call takes 2 s: slow, so the breaker opens at once
    guard = guarded(host_pool, fake, breaker)
    assert guard.batch_exists(["a"]) == 0
    assert guard.batch_exists(["a"]) == 0  # refused
    clock.now += 5.0
    assert guard.batch_exists(["a"]) == 0  # the trial: slow again, reopens
    s = guard.stats()
    assert s.faults == {"slow_call": 2, "breaker_trip": 2} and s.breaker_trips == 2
    assert (s.failures, s.refused) == (2, 1)


def test_a_backends_own_faults_add_to_the_guards(host_pool) -> None:  # type: ignore[no-untyped-def]
    fake = Counting()
    guard = guarded(host_pool, fake)
    fake.mode = "raise"
    assert guard.batch_exists(["a"]) == 0
    assert guard.stats().faults == {"io_EIO": 2, "backend_error": 2}
