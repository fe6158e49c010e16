"""MooncakeStore against a real master and standalone store (see conftest.py), byte-exact."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hicache.backends.breaker import CircuitBreaker
from hicache.backends.guard import GuardedStorage
from hicache.backends.keys import object_keys
from hicache.backends.mooncake import MooncakeStore
from hicache.backends.mooncake_servers import MooncakeServers
from tests.storage_mooncake.helpers import (
    fill_random,
    fresh_keys,
    host_pool,
    page_bytes,
    poison,
    slots,
)

pytestmark = pytest.mark.mooncake
ROOT = Path(__file__).resolve().parents[2]


def raw_client(servers: MooncakeServers):  # type: ignore[no-untyped-def]
    from mooncake.store import MooncakeDistributedStore

    raw = MooncakeDistributedStore()
    assert (
        raw.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", servers.master_address) == 0
    )
    return raw


def store_for(servers: MooncakeServers, pool) -> MooncakeStore:  # type: ignore[no-untyped-def]
    store = MooncakeStore(master_server_address=servers.master_address)
    store.register_mem_pool_host(pool)
    return store


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_round_trip_byte_exact(mooncake: MooncakeServers, kind: str, layout: str) -> None:
    pool = host_pool(kind, layout)
    fill_random(pool, seed=hash((kind, layout)) & 0xFFFF)
    store = store_for(mooncake, pool)
    assert store.page_io().zero_copy == (layout != "layer_first")
    keys, written = fresh_keys(4), [1, 5, 2, 7]
    expected = [page_bytes(pool, p) for p in written]
    assert store.batch_set_v1(keys, slots(written)) == [True] * 4
    assert store.batch_set_v1(keys[:2], slots([0, 3])) == [True, True]  # present: skipped
    poison(pool)
    untouched = [page_bytes(pool, p) for p in (0, 3)]
    read = [6, 4, 1, 3]
    assert store.batch_get_v1(keys, slots(read)) == [True] * 4
    assert [page_bytes(pool, p) for p in read] == expected  # the skipped set wrote nothing
    assert [page_bytes(pool, p) for p in (0, 5)] == [untouched[0], untouched[0]]
    missing = fresh_keys(1)
    assert store.batch_get_v1([keys[0], missing[0]], slots([2, 0])) == [True, False]
    assert page_bytes(pool, 2) == expected[0]
    store.close()
    store.close()  # idempotent; later calls are misses
    assert store.batch_exists(keys) == 0 and store.batch_get_v1(keys[:1], slots([0])) == [False]


def test_close_waits_for_calls_in_flight(mooncake: MooncakeServers) -> None:
    pool = host_pool("mha", "page_first")
    fill_random(pool, seed=8)
    store = store_for(mooncake, pool)
    keys = fresh_keys(4)
    assert store.batch_set_v1(keys, slots([0, 1, 2, 3])) == [True] * 4
    seen: list[object] = []

    def reader() -> None:
        for _ in range(300):
            seen.append(store.batch_exists(keys))
            seen.append(store.batch_get_v1(keys, slots([4, 5, 6, 7])))

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.05)
    store.close()
    thread.join()
    assert len(seen) == 600 and {4, 0} >= {x for x in seen[::2]}
    assert seen[-2:] == [0, [False] * 4]  # after close: misses
    assert store.get_stats()["closed"] is True


def test_writer_process_exits_reader_hits(mooncake: MooncakeServers) -> None:
    keys = fresh_keys(3)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    writer = subprocess.run(
        [sys.executable, "-m", "tests.storage_mooncake.writer", mooncake.master_address, "7"]
        + keys,
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert writer.returncode == 0, writer.stderr[-2000:]
    assert writer.stdout.strip().endswith("[True, True, True]")
    expected = host_pool("mha", "page_first")
    fill_random(expected, seed=7)
    pool = host_pool("mha", "page_first")
    poison(pool)
    store = store_for(mooncake, pool)
    assert store.batch_exists(keys) == 3
    assert store.batch_get_v1(keys, slots([4, 5, 6])) == [True] * 3
    assert [page_bytes(pool, p) for p in (4, 5, 6)] == [page_bytes(expected, p) for p in range(3)]
    store.close()


def test_batch_exists_is_the_present_prefix(mooncake: MooncakeServers) -> None:
    pool = host_pool("mha", "page_first")
    fill_random(pool, seed=3)
    store = store_for(mooncake, pool)
    keys = fresh_keys(5)
    assert store.batch_exists(keys) == 0
    assert store.batch_set_v1([keys[0], keys[1], keys[3]], slots([0, 1, 3])) == [True] * 3
    assert store.batch_exists(keys) == 2
    assert store.batch_exists(keys[3:]) == 1 and store.batch_exists([]) == 0
    # A page counts only when all its objects are there: page 2's K object alone is not.
    raw = raw_client(mooncake)
    assert raw.put(object_keys(keys[2], 2)[0], b"\x5a" * 4096) == 0
    assert store.batch_exists(keys) == 2
    assert raw.put(object_keys(keys[2], 2)[1], b"\x5a" * 4096) == 0
    assert store.batch_exists(keys) == 4
    raw.close()
    with pytest.raises(TypeError):
        store.batch_exists("abc")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        store.batch_get_v1(keys[:2], slots([0]))
    store.close()


def test_full_store_gives_misses_not_errors(own_mooncake) -> None:  # type: ignore[no-untyped-def]
    servers = own_mooncake("32 MB")
    pool = host_pool("mha", "page_first", pages=32, heads=8, dim=64)  # 64 KiB objects, 2 MiB
    fill_random(pool, seed=5)
    breaker = CircuitBreaker(failure_threshold=1, slow_call_s=5.0)
    store = GuardedStorage(MooncakeStore(master_server_address=servers.master_address),
                           "mooncake", breaker)  # fmt: skip
    store.register_mem_pool_host(pool)
    page_set = list(range(32))
    rounds = [fresh_keys(32) for _ in range(40)]  # 80 MiB into 32 MB
    results = [store.batch_set_v1(keys, slots(page_set)) for keys in rounds]
    assert all(r == [bool(b) for b in r] and len(r) == 32 for r in results)
    expected = [page_bytes(pool, p) for p in page_set]
    poison(pool)
    present = 0
    for keys in rounds:
        got = store.batch_get_v1(keys, slots(page_set))
        present += sum(got)
        assert [page_bytes(pool, p) for p, ok in zip(page_set, got, strict=True) if ok] == [
            expected[p] for p, ok in zip(page_set, got, strict=True) if ok
        ]
        poison(pool)
    assert 0 < present < 32 * 40  # some written, not all kept
    assert sum(not ok for r in results for ok in r) + (32 * 40 - present) > 0
    assert isinstance(store.batch_exists(rounds[0]), int)
    s = store.stats()  # a full store is healthy: misses, not failures
    assert (s.failures, s.refused, s.breaker_state) == (0, 0, "closed")
    assert s.pages_read == present and s.pages_written == sum(map(sum, results))
    store.close()


def test_killed_master_fast_misses_behind_the_breaker(own_mooncake) -> None:  # type: ignore[no-untyped-def]
    servers = own_mooncake("64 MB")
    pool = host_pool("mha", "page_first")
    fill_random(pool, seed=6)
    breaker = CircuitBreaker(failure_threshold=3, slow_call_s=1.0, backoff_s=60.0)
    guard = GuardedStorage(MooncakeStore(master_server_address=servers.master_address),
                           "mooncake", breaker)  # fmt: skip
    guard.register_mem_pool_host(pool)
    keys = fresh_keys(2)
    assert guard.batch_set_v1(keys, slots([0, 1])) == [True, True]
    assert guard.batch_exists(keys) == 2
    servers.kill_master()
    took = []  # the first call may fail fast (the connection is gone), a later one is slow
    while breaker.state != "open" and len(took) < 4:
        start = time.monotonic()
        assert guard.batch_get_v1(keys, slots([2, 3])) == [False, False]
        took.append(time.monotonic() - start)
    assert breaker.state == "open", took
    assert sum(t > 1.0 for t in took) <= 1, took  # opened by the first slow failure at latest
    failures = guard.stats().failures
    start = time.monotonic()
    for _ in range(10):
        assert guard.batch_exists(keys) == 0
        assert guard.batch_get_v1(keys, slots([2, 3])) == [False, False]
        assert guard.batch_set_v1(keys, slots([2, 3])) == [False, False]
    per_call = (time.monotonic() - start) / 30
    assert per_call < 0.1
    s = guard.stats()
    assert (s.refused, s.failures, s.breaker_state) == (30, failures, "open")
    assert s.failures == len(took)
    assert guard.get_stats()["master"] == servers.master_address
    guard.close()
