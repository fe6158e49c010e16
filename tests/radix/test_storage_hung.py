"""A hung storage backend through HiRadixCache: every call is bounded by ``call_timeout_s``, so
later prefetches go on, ``drain_transfers``/``close``/``reset`` return, the timeout is counted,
and the host slots a timed-out read holds are quarantined until it returns (none leak)."""

from __future__ import annotations

import threading
import time
from typing import Any

from hicache.backends.memory import MemoryStorage
from hicache.radix import RadixKey
from tests.radix.storage_helpers import (
    make_stack,
    prefetch,
    random_ids,
    storage_config,
    write_prefix,
)

TIMEOUT = 0.2
BOUND = 3.0  # seconds drain/close/reset may take: the stated (call_workers + 1) deadlines, + slack


class HungStorage(MemoryStorage):
    """A memory store whose next ``hang_gets`` reads and, while ``hang_sets``, every write wait
    for ``gate`` (at most 30 s: far past every bound the tests allow)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.hang_gets, self.hang_sets = 0, False

    def batch_get_v1(self, keys, host_indices, extra_info=None):  # type: ignore[no-untyped-def]
        if self.hang_gets:
            self.hang_gets -= 1
            self.gate.wait(30)
        return super().batch_get_v1(keys, host_indices, extra_info)

    def batch_set_v1(self, keys, host_indices, extra_info=None):  # type: ignore[no-untyped-def]
        if self.hang_sets:
            self.gate.wait(30)
        return super().batch_set_v1(keys, host_indices, extra_info)


def _stack(backend: HungStorage) -> Any:
    return make_stack(storage_config(backend, call_timeout_s=TIMEOUT))


def _timed(fn: Any) -> float:
    began = time.monotonic()
    fn()
    return time.monotonic() - began


def _settled(cache: Any) -> None:
    """Wait (5 s bound) until no timed-out call still holds host slots, then poll."""
    deadline = time.monotonic() + 5
    while cache.storage_tier.storage.held_slots().numel():
        assert time.monotonic() < deadline, "the abandoned call never returned"
        time.sleep(0.005)
    cache.check_hicache_events()


def _stored(backend: HungStorage, *prefixes: list[int]) -> Any:
    """A cache whose storage holds ``prefixes`` while its tree and host are empty."""
    stack = _stack(backend)
    for seed, ids in enumerate(prefixes):
        write_prefix(stack, ids, seed=seed)
    stack.cache.reset()
    return stack


def test_a_hung_read_does_not_stall_later_prefetches() -> None:
    backend = HungStorage()
    a, b = random_ids(32, 1), random_ids(32, 2)
    stack = _stored(backend, a, b)
    cache, host_pool = stack.cache, stack.cache.cache_controller.mem_pool_host
    free = host_pool.available_size()
    backend.hang_gets = 1
    assert prefetch(cache, "a", a) == 0  # its read timed out: a miss
    assert prefetch(cache, "b", b) == 32  # the next prefetch is not stuck behind it
    assert cache.storage_tier.storage.stats().timeouts == 1
    assert cache.host_tier.reserved() == 32  # a's slots: quarantined, not reused
    cache.check_invariants()
    backend.gate.set()
    _settled(cache)
    assert cache.host_tier.reserved() == 0
    assert host_pool.available_size() == free - 32  # b's pages, nothing else
    cache.check_invariants()


def test_reset_is_bounded_with_a_hung_read_and_leaks_nothing() -> None:
    backend = HungStorage()
    a = random_ids(32, 1)
    stack = _stored(backend, a)
    cache, host_pool = stack.cache, stack.cache.cache_controller.mem_pool_host
    free = host_pool.available_size()
    backend.hang_gets = 1
    m = cache.match_prefix(RadixKey(a))
    assert cache.prefetch_from_storage("a", m.last_host_node, RadixKey(a))
    deadline = time.monotonic() + 5
    while backend.hang_gets:  # until its read is in the backend, hung
        assert time.monotonic() < deadline, "the read never started"
        cache.check_prefetch_progress("a")
    assert _timed(cache.reset) < BOUND
    cache.check_invariants()
    assert host_pool.available_size() == free
    backend.gate.set()
    _settled(cache)
    assert host_pool.available_size() == free
    cache.check_invariants()


def test_drain_and_close_are_bounded_with_hung_writes() -> None:
    backend = HungStorage()
    backend.hang_sets = True
    stack = _stack(backend)
    cache = stack.cache
    for seed in range(3):
        ids = random_ids(32, seed)
        cache.insert(RadixKey(ids), stack.allocator.alloc(32))
    assert _timed(cache.drain_transfers) < BOUND
    storage = cache.storage_tier.storage
    assert storage.stats().timeouts >= 1
    assert cache.stats().storage.pending_backups == 0  # nothing stays pinned
    cache.check_invariants()
    assert _timed(cache.close) < BOUND
    assert storage.stats().timeouts >= 1
    backend.gate.set()
    cache.check_invariants()


def test_a_timed_out_write_pins_its_node_until_the_write_returns() -> None:
    backend = HungStorage()
    backend.hang_sets = True
    stack = _stack(backend)
    cache = stack.cache
    cache.insert(RadixKey(random_ids(32, 1)), stack.allocator.alloc(32))
    cache.drain_transfers()  # the storage write times out, still reading the host slots
    cache.evict(10_000)  # a host-only node now
    assert cache.evict_host(10_000) == 0  # its slots must not be reused under the late write
    assert cache.stats().storage.pending_backups == 0
    cache.check_invariants()
    backend.hang_sets = False
    backend.gate.set()
    _settled(cache)
    assert cache.evict_host(10_000) == 32
    cache.check_invariants()


class DeadStorage(HungStorage):
    """A store whose every call, queries and ``close`` too, waits for ``gate``."""

    def batch_exists(self, keys, extra_info=None):  # type: ignore[no-untyped-def]
        self.gate.wait(30)
        return super().batch_exists(keys, extra_info)

    def close(self) -> None:
        self.gate.wait(30)
        super().close()


def test_a_backend_that_never_answers_costs_drain_and_close_a_stated_bound() -> None:
    backend = DeadStorage()
    backend.hang_sets, backend.hang_gets = True, 10**6
    stack = _stack(backend)
    cache = stack.cache
    for seed in range(4):
        ids = random_ids(32, seed)
        cache.insert(RadixKey(ids), stack.allocator.alloc(32))
        m = cache.match_prefix(RadixKey(ids + random_ids(32, 9)))
        cache.prefetch_from_storage(f"r{seed}", m.last_host_node, RadixKey(random_ids(32, 9)))
    bound = (stack.cache.storage_tier.config.call_workers + 1) * TIMEOUT + 0.5
    assert _timed(cache.drain_transfers) < bound
    assert all(cache.check_prefetch_progress(f"r{seed}") for seed in range(4))
    assert _timed(cache.close) < bound
    cache.check_invariants()
    backend.gate.set()
