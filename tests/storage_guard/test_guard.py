"""GuardedStorage and CircuitBreaker against tiny fake backends (no server, no files)."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from hicache.backends.base import HiCacheStorage
from hicache.backends.breaker import SLOW_CALL_PAGES, CircuitBreaker
from hicache.backends.guard import GuardedStorage, StorageStats
from hicache.pools import MHATokenToKVPool, MHATokenToKVPoolHost

PAGE = 4


class Clock:
    """A hand-driven monotonic clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Fake(HiCacheStorage):
    """Pages in a set; ``mode``: ``ok``, ``raise`` (every call), ``none`` (malformed results),
    ``slow`` (each call advances ``clock`` by ``delay``)."""

    def __init__(self, clock: Clock | None = None, delay: float = 0.0) -> None:
        self.present: set[str] = set()
        self.mode = "ok"
        self.calls = 0
        self.clock, self.delay = clock, delay

    def _enter(self) -> None:
        self.calls += 1
        if self.mode == "raise":
            raise OSError("disk on fire")
        if self.clock is not None:
            self.clock.now += self.delay

    def batch_exists(self, keys, extra_info=None):  # type: ignore[no-untyped-def]
        self._enter()
        if self.mode == "none":
            return None
        n = 0
        while n < len(keys) and keys[n] in self.present:
            n += 1
        return n

    def batch_get_v1(self, keys, host_indices, extra_info=None):  # type: ignore[no-untyped-def]
        self._enter()
        if self.mode == "none":
            return [True]  # wrong length
        return [k in self.present for k in keys]

    def batch_set_v1(self, keys, host_indices, extra_info=None):  # type: ignore[no-untyped-def]
        self._enter()
        if self.mode == "none":
            return None
        self.present.update(keys)
        return [True] * len(keys)

    def clear(self) -> None:
        self._enter()

    def close(self) -> None:
        self._enter()

    def get_stats(self):  # type: ignore[no-untyped-def]
        if self.mode == "raise":
            raise RuntimeError("no stats")
        return {"objects": len(self.present), "backend": "fake"}


@pytest.fixture(scope="module")
def host_pool() -> MHATokenToKVPoolHost:
    device = MHATokenToKVPool(16, PAGE, torch.float16, 2, 8, 3, "cpu")
    return MHATokenToKVPoolHost(device, 2.0, 0, PAGE, "page_first", pin_memory=False)


def guarded(pool, fake: Fake, breaker: CircuitBreaker | None = None) -> GuardedStorage:  # type: ignore[no-untyped-def]
    guard = GuardedStorage(fake, "fake", breaker)
    guard.register_mem_pool_host(pool)
    return guard


def slots(pages: int) -> torch.Tensor:
    return torch.arange(pages * PAGE, dtype=torch.int64)


def page_bytes(pool) -> int:  # type: ignore[no-untyped-def]
    return pool.layer_num * pool.item_size * PAGE * 2


# -- GuardedStorage --------------------------------------------------------------------------


def test_counts_queries_hits_and_bytes(host_pool) -> None:  # type: ignore[no-untyped-def]
    guard = guarded(host_pool, Fake())
    keys = ["a", "b", "c"]
    assert guard.batch_set_v1(keys[:2], slots(2)) == [True, True]
    assert guard.batch_exists(keys) == 2
    assert guard.batch_exists(["c"]) == 0
    assert guard.batch_get_v1(keys, slots(3)) == [True, True, False]
    s = guard.stats()
    assert isinstance(s, StorageStats)
    assert (s.backend, s.queries, s.query_pages, s.hit_pages) == ("fake", 2, 4, 2)
    assert (s.pages_written, s.pages_read) == (2, 2)
    assert s.bytes_written == s.bytes_read == 2 * page_bytes(host_pool)
    assert (s.failures, s.refused, s.breaker_state) == (0, 0, "none")
    assert s.read_seconds >= 0 and s.write_seconds >= 0
    stats = guard.get_stats()
    assert stats["objects"] == 2 and stats["backend"] == "fake" and stats["hit_pages"] == 2
    assert {"read_gbps", "write_gbps"} <= stats.keys()
    with pytest.raises(AttributeError):
        s.queries = 9  # type: ignore[misc]


def test_gbps_from_counters() -> None:
    assert StorageStats("x").read_gbps == StorageStats("x").write_gbps == 0.0
    s = StorageStats("x", bytes_read=4_000_000_000, read_seconds=2.0, bytes_written=10**9,
                     write_seconds=0.5)  # fmt: skip
    assert s.read_gbps == pytest.approx(2.0) and s.write_gbps == pytest.approx(2.0)


def test_raising_backend_is_a_miss_logged_once(host_pool, caplog) -> None:  # type: ignore[no-untyped-def]
    fake = Fake()
    guard = guarded(host_pool, fake)
    fake.mode = "raise"
    with caplog.at_level(logging.WARNING, logger="hicache.backends.guard"):
        for _ in range(3):
            assert guard.batch_exists(["a", "b"]) == 0
            assert guard.batch_get_v1(["a"], slots(1)) == [False]
            assert guard.batch_set_v1(["a", "b"], slots(2)) == [False, False]
        guard.clear()
        guard.close()
        stats = guard.get_stats()
    assert sum("disk on fire" in r.getMessage() for r in caplog.records) == 1
    s = guard.stats()
    assert (s.failures, s.pages_read, s.pages_written, s.hit_pages) == (11, 0, 0, 0)
    assert stats["failures"] == 11 and "objects" not in stats


def test_malformed_results_are_misses(host_pool) -> None:  # type: ignore[no-untyped-def]
    fake = Fake()
    guard = guarded(host_pool, fake)
    fake.mode = "none"
    assert guard.batch_exists(["a"]) == 0
    assert guard.batch_get_v1(["a", "b"], slots(2)) == [False, False]
    assert guard.batch_set_v1(["a"], slots(1)) == [False]
    assert guard.stats().failures == 3


def test_caller_bugs_still_raise(host_pool) -> None:  # type: ignore[no-untyped-def]
    fake = Fake()
    guard = guarded(host_pool, fake)
    with pytest.raises(TypeError):
        guard.batch_exists("abc")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        guard.batch_get_v1(["a", "b"], slots(1))
    with pytest.raises(ValueError):
        guard.batch_set_v1(["a"], torch.arange(1, PAGE + 1, dtype=torch.int64))
    with pytest.raises(ValueError):
        guard.register_mem_pool_host(host_pool)
    with pytest.raises(ValueError):
        GuardedStorage(Fake(), "fresh").batch_exists(["a"])
    with pytest.raises(TypeError):
        GuardedStorage(object(), "x")  # type: ignore[arg-type]
    assert fake.calls == 0 and guard.stats().failures == 0


def test_counters_are_thread_safe(host_pool) -> None:  # type: ignore[no-untyped-def]
    fake = Fake()
    guard = guarded(host_pool, fake)
    fake.present.update(["a", "b"])

    def work() -> None:
        for _ in range(200):
            guard.batch_exists(["a", "b", "c"])
            guard.batch_get_v1(["a"], slots(1))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = guard.stats()
    assert (s.queries, s.query_pages, s.hit_pages, s.pages_read) == (800, 2400, 1600, 800)


# -- CircuitBreaker, alone and behind the guard ----------------------------------------------


def test_breaker_opens_after_consecutive_failures_only() -> None:
    clock = Clock()
    br = CircuitBreaker(failure_threshold=3, slow_call_s=1.0, backoff_s=5.0, clock=clock)
    for ok in (False, False, True, False, False):  # a success resets the run
        assert br.allow()
        br.record(ok, 0.01)
    assert br.state == "closed"
    assert br.allow()
    assert br.record(False, 0.01) is True
    assert br.state == "open" and not br.allow()


def test_breaker_half_open_trial_and_doubling_backoff() -> None:
    clock = Clock()
    br = CircuitBreaker(failure_threshold=1, slow_call_s=1.0, backoff_s=2.0, max_backoff_s=5.0,
                        clock=clock)  # fmt: skip
    br.allow()
    br.record(False, 0.0)
    clock.now += 1.9
    assert br.state == "open" and not br.allow()
    clock.now += 0.2
    assert br.allow() and br.state == "half_open"
    assert not br.allow()  # one trial at a time
    br.record(False, 0.0)  # the trial fails: open again, back-off 4
    assert br.state == "open" and br.current_backoff_s == 4.0
    clock.now += 3.9
    assert not br.allow()
    clock.now += 0.2
    assert br.allow()
    br.record(False, 0.0)
    assert br.current_backoff_s == 5.0  # capped
    clock.now += 5.0
    assert br.allow()
    br.record(True, 0.0)  # the trial succeeds: closed, back-off reset
    assert br.state == "closed" and br.current_backoff_s == 2.0 and br.opened == 3


def test_breaker_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        CircuitBreaker(failure_threshold=0)
    with pytest.raises(TypeError):
        CircuitBreaker(slow_call_s="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        CircuitBreaker(backoff_s=10.0, max_backoff_s=5.0)
    with pytest.raises(ValueError):
        CircuitBreaker(backoff_s=float("inf"))


def test_guard_slow_call_opens_then_refuses_then_recovers(host_pool) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    fake = Fake(clock, delay=4.0)  # a dead server: seconds per call, then a miss
    br = CircuitBreaker(failure_threshold=5, slow_call_s=1.0, backoff_s=10.0, clock=clock)
    guard = guarded(host_pool, fake, br)
    fake.present.add("a")
    assert guard.batch_get_v1(["a"], slots(1)) == [True]  # slow, even if it worked
    assert guard.stats().breaker_state == "open" and guard.stats().failures == 1
    for _ in range(5):
        assert guard.batch_exists(["a"]) == 0
        assert guard.batch_get_v1(["a"], slots(1)) == [False]
        assert guard.batch_set_v1(["b"], slots(1)) == [False]
    assert fake.calls == 1
    s = guard.stats()
    assert (s.refused, s.queries, s.query_pages, s.hit_pages) == (15, 5, 5, 0)
    clock.now += 10.0
    fake.delay = 0.01  # the server is back
    assert guard.batch_exists(["a"]) == 1  # the trial
    assert guard.stats().breaker_state == "closed"
    assert guard.batch_set_v1(["b"], slots(1)) == [True] and fake.calls == 3


def test_guard_raising_backend_opens_after_threshold(host_pool) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    fake = Fake()
    br = CircuitBreaker(failure_threshold=2, slow_call_s=1.0, backoff_s=3.0, clock=clock)
    guard = guarded(host_pool, fake, br)
    fake.mode = "raise"
    assert guard.batch_exists(["a"]) == 0
    assert guard.stats().breaker_state == "closed"
    assert guard.batch_exists(["a"]) == 0
    assert guard.stats().breaker_state == "open"
    assert guard.batch_exists(["a"]) == 0 and fake.calls == 2
    clock.now += 3.0
    assert guard.batch_exists(["a"]) == 0  # the trial fails: reopened, back-off doubled
    s = guard.stats()
    assert (s.failures, s.refused, s.breaker_state) == (3, 1, "open")
    assert br.current_backoff_s == 6.0 and fake.calls == 3


class SoftFailing(Fake):
    """Fails the way the contract asks: a miss, counted in ``failure_count``."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = 0

    def failure_count(self) -> int:
        return self.failed

    def batch_exists(self, keys, extra_info=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        self.failed += 1
        return 0


def test_backend_counted_failures_feed_the_breaker(host_pool) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    fake = SoftFailing()
    br = CircuitBreaker(failure_threshold=2, slow_call_s=1.0, backoff_s=3.0, clock=clock)
    guard = guarded(host_pool, fake, br)
    assert fake.pages is not None  # the pool was forwarded
    fake.present.add("a")
    assert guard.batch_get_v1(["a"], slots(1)) == [True]  # no failure counted: stays closed
    for _ in range(4):
        assert guard.batch_exists(["a"]) == 0
    s = guard.stats()
    assert (s.failures, s.refused, s.breaker_state, fake.calls) == (2, 2, "open", 3)


def test_a_large_batch_is_allowed_time_in_proportion() -> None:
    """slow_call_s per SLOW_CALL_PAGES pages: a 256-page call of 3 s is not slow; a one-page
    call of 1.5 s is (and opens the breaker at once)."""
    br = CircuitBreaker(slow_call_s=1.0)
    assert br.slow_limit(1) == 1.0 and br.slow_limit(4 * SLOW_CALL_PAGES) == 4.0
    assert br.record(True, 3.0, 4 * SLOW_CALL_PAGES) is False and br.state == "closed"
    assert br.record(True, 1.5, 1) is True and br.state == "open"
