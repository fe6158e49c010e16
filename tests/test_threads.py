"""The wrong-thread guard: a cache, an allocator, a request pool or an engine driven from a second
thread raises RuntimeError naming both threads, before any change; ``bind_thread`` hands it over;
queries stay free; an ended owner is replaced."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from hicache import env
from hicache.engine import CacheSpec, EngineConfig, build_engine
from hicache.model import ModelConfig, TinyTransformer
from hicache.pools import ReqToTokenPool, TokenToKVPoolAllocator
from hicache.radix import RadixCache
from hicache.threads import WrongThreadError
from tests.radix.hiradix_rig import make_cache

pytestmark = pytest.mark.skipif(
    not env.threads_checked(), reason="HICACHE_CHECK_THREADS is off (tests/conftest.py sets it)"
)


def _on_thread(fn: Callable[[], Any], name: str = "intruder") -> BaseException | None:
    """Run ``fn`` on a new thread named ``name``; the exception it raised, if any."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as err:  # noqa: BLE001 (handed back to the test)
            caught.append(err)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    return caught[0] if caught else None


def _refused(fn: Callable[[], Any]) -> str:
    err = _on_thread(fn)
    assert isinstance(err, WrongThreadError) and isinstance(err, RuntimeError), err
    return str(err)


def test_a_second_thread_on_the_allocator_is_refused_before_any_change() -> None:
    alloc = TokenToKVPoolAllocator(256, page_size=16)
    slots = alloc.alloc(64)
    assert slots is not None
    free_before = alloc.available_size()
    message = _refused(lambda: alloc.free(slots))
    assert "intruder" in message and threading.current_thread().name in message
    assert "TokenToKVPoolAllocator.free" in message and "bind_thread()" in message
    assert alloc.available_size() == free_before
    for call in (lambda: alloc.alloc(16), lambda: alloc.alloc_cpu(16), alloc.clear):
        _refused(call)
    assert _on_thread(alloc.available_size) is None  # a query
    alloc.free(slots)
    alloc.check_invariants()
    assert alloc.available_size() == 256


def test_a_second_thread_on_the_request_pool_is_refused() -> None:
    pool = ReqToTokenPool(4, 8, "cpu")
    rows = pool.alloc(1)
    assert rows is not None
    for call in (lambda: pool.alloc(1), lambda: pool.free(rows), pool.clear):
        _refused(call)
    _refused(lambda: pool.write((rows[0], slice(0, 2)), torch.ones(2, dtype=torch.int32)))
    assert pool.available_size() == 3 and pool.is_allocated(rows[0])


def _cache(kind: str) -> RadixCache:
    if kind == "hiradix":
        return make_cache(page_size=4, pages=16)
    return RadixCache(None, TokenToKVPoolAllocator(64, page_size=4), 4)


@pytest.mark.parametrize("kind", ["radix", "hiradix"])
def test_a_second_thread_on_the_cache_is_refused(kind: str) -> None:
    cache = _cache(kind)
    slots = cache.token_to_kv_pool_allocator.alloc(8)
    cache.insert(list(range(8)), slots)
    message = _refused(lambda: cache.insert(list(range(100, 108)), slots))
    assert f"{type(cache).__name__}.insert" in message
    for call in (lambda: cache.match_prefix([0, 1, 2, 3]), lambda: cache.evict(8), cache.reset):
        _refused(call)
    _refused(cache.check_hicache_events)
    assert _on_thread(cache.stats) is None and _on_thread(cache.check_invariants) is None
    assert cache.evictable_size() == 8
    cache.check_invariants()


def test_bind_thread_hands_the_cache_over() -> None:
    alloc = TokenToKVPoolAllocator(64, page_size=1)
    cache = RadixCache(None, alloc)
    cache.insert([1, 2, 3], alloc.alloc(3))
    handed, done = threading.Event(), threading.Event()

    def driver() -> None:
        cache.bind_thread()
        alloc.bind_thread()
        cache.evict(3)
        handed.set()
        done.wait(10)

    thread = threading.Thread(target=driver, name="driver")
    thread.start()
    assert handed.wait(10)
    with pytest.raises(WrongThreadError, match="driven by thread 'driver'"):
        cache.reset()
    done.set()
    thread.join()
    assert alloc.available_size() == 64 and cache.owner_thread is thread


def test_an_ended_owner_is_replaced_by_the_next_caller() -> None:
    alloc = TokenToKVPoolAllocator(64, page_size=1)
    assert _on_thread(lambda: alloc.alloc(4), "builder") is None
    assert alloc.alloc(4) is not None  # the builder thread has ended
    _refused(lambda: alloc.alloc(4))


def test_a_second_thread_on_the_engine_is_refused() -> None:
    spec = CacheSpec(device_tokens=64, max_context_len=64, max_requests=4)
    config = EngineConfig(max_running_requests=2, max_prefill_tokens=32)
    engine = build_engine(TinyTransformer(ModelConfig(num_layers=1, vocab_size=64)), spec, config)
    req = engine.submit([1, 2, 3, 4], 2)
    for call in (engine.step, engine.run, lambda: engine.submit([1, 2], 1)):
        assert "Engine." in _refused(call)
    assert len(engine.scheduler.waiting) == 1

    def drive() -> None:
        engine.bind_thread()  # the engine, its cache and its pools
        engine.run()

    assert _on_thread(drive, "driver") is None
    assert req.output_ids and not engine.has_work()
