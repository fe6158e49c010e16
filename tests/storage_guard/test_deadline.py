"""CallRunner and GuardedStorage under a deadline: a call that hangs is abandoned, counted as a
timeout, and holds its host slots until it really returns."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from hicache.backends import StorageConfig
from hicache.backends.breaker import CircuitBreaker
from hicache.backends.deadline import CallRunner
from hicache.backends.guard import GuardedStorage
from hicache.backends.memory import MemoryStorage
from hicache.pools import MHATokenToKVPool, MHATokenToKVPoolHost

PAGE = 4


class Hung(MemoryStorage):
    """A memory store whose calls named in ``hang`` wait for ``gate`` (at most 30 s)."""

    def __init__(self, *hang: str) -> None:
        super().__init__()
        self.hang, self.gate = set(hang), threading.Event()

    def _wait(self, what: str) -> None:
        if what in self.hang:
            self.gate.wait(30)

    def batch_get_v1(self, keys, host_indices, extra_info=None):  # type: ignore[no-untyped-def]
        self._wait("get")
        return super().batch_get_v1(keys, host_indices, extra_info)

    def close(self) -> None:
        self._wait("close")
        super().close()


def until(what, seconds: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


@pytest.fixture
def host_pool() -> MHATokenToKVPoolHost:
    device = MHATokenToKVPool(16, PAGE, torch.float16, 2, 8, 3, "cpu")
    return MHATokenToKVPoolHost(device, 2.0, 0, PAGE, "page_first", pin_memory=False)


def test_runner_returns_results_and_raises_what_the_call_raised() -> None:
    runner = CallRunner(1.0, 2, "t")
    assert runner.run(lambda: 7) == (True, 7)
    with pytest.raises(OSError, match="disk"):
        runner.run(lambda: (_ for _ in ()).throw(OSError("disk")))
    assert runner.abandoned() == 0
    runner.close()


def test_runner_abandons_a_hung_call_and_holds_its_slots_until_it_returns() -> None:
    runner, gate = CallRunner(0.1, 2, "t"), threading.Event()
    slots = torch.arange(8, dtype=torch.int64)
    began = time.monotonic()
    assert runner.run(lambda: gate.wait(30), slots) == (False, None)
    assert time.monotonic() - began < 2.0
    assert runner.abandoned() == 1
    assert torch.equal(runner.held_slots(), slots)
    assert runner.run(lambda: 3) == (True, 3)  # another worker serves the next call
    gate.set()
    until(lambda: runner.abandoned() == 0)
    assert runner.held_slots().numel() == 0
    runner.close()


def test_runner_refuses_at_once_when_every_worker_is_stuck_or_closed() -> None:
    runner, gate = CallRunner(0.1, 1, "t"), threading.Event()
    assert runner.run(lambda: gate.wait(30)) == (False, None)
    began = time.monotonic()
    assert runner.run(lambda: 3) == (False, None)
    assert time.monotonic() - began < 0.05
    gate.set()
    until(lambda: runner.abandoned() == 0)
    assert runner.run(lambda: 3) == (True, 3)
    runner.close()
    assert runner.run(lambda: 3) == (False, None)


def alive(name: str) -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(f"hicache-{name}-"))


def test_close_waits_for_its_workers_but_the_one_stuck_in_an_abandoned_call() -> None:
    runner, gate = CallRunner(0.2, 3, "closing"), threading.Event()
    assert runner.run(lambda: 1) == (True, 1)
    assert runner.run(lambda: gate.wait(30)) == (False, None)
    began = time.monotonic()
    runner.close()  # no worker of a closed runner is left running at interpreter exit
    assert time.monotonic() - began < 1.0 and len(alive("closing")) == 1  # the stuck one
    gate.set()
    until(lambda: not alive("closing"))


@pytest.mark.parametrize(
    ("timeout_s", "workers", "error"),
    [(0, 1, ValueError), (-1.0, 1, ValueError), (float("inf"), 1, ValueError),
     ("1", 1, TypeError), (True, 1, TypeError), (1.0, 0, ValueError), (1.0, 1.5, TypeError)],
)  # fmt: skip
def test_runner_rejects_bad_settings(timeout_s, workers, error) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match="timeout_s|workers"):
        CallRunner(timeout_s, workers, "t")


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [("call_timeout_s", 0, ValueError), ("call_timeout_s", -1, ValueError),
     ("call_timeout_s", "9", TypeError), ("call_workers", 0, ValueError)],
)  # fmt: skip
def test_config_rejects_bad_deadlines(field, value, error) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=field):
        StorageConfig(**{field: value})
    assert StorageConfig().call_timeout_s == 10.0 and StorageConfig().call_workers == 4


def test_guard_counts_a_timed_out_read_as_a_miss_and_trips_the_breaker(host_pool) -> None:  # type: ignore[no-untyped-def]
    backend = Hung("get")
    breaker = CircuitBreaker(slow_call_s=0.05)
    guard = GuardedStorage(backend, "hung", breaker, CallRunner(0.1, 2, "hung"))
    guard.register_mem_pool_host(host_pool)
    slots = torch.arange(2 * PAGE, dtype=torch.int64)
    assert guard.batch_set_v1(["a", "b"], slots) == [True, True]
    began = time.monotonic()
    assert guard.batch_get_v1(["a", "b"], slots) == [False, False]
    assert time.monotonic() - began < 2.0
    s = guard.stats()
    assert (s.timeouts, s.failures, s.pages_read, s.breaker_trips) == (1, 1, 0, 1)
    assert torch.equal(guard.held_slots(), slots)
    backend.gate.set()
    until(lambda: guard.held_slots().numel() == 0)
    assert guard.stats().pages_read == 0  # the late result was discarded


def test_guard_close_is_bounded_with_a_hung_backend(host_pool) -> None:  # type: ignore[no-untyped-def]
    backend = Hung("close")
    guard = GuardedStorage(backend, "hung", None, CallRunner(0.1, 2, "hung"))
    guard.register_mem_pool_host(host_pool)
    began = time.monotonic()
    guard.close()
    assert time.monotonic() - began < 2.0
    assert (guard.stats().timeouts, guard.stats().failures) == (1, 1)
    backend.gate.set()
