"""HiCacheFile beyond the shared contract: the byte cap and its LRU, several processes on one
directory, corrupt files, persistence across processes, a failing file system."""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hicache.backends.file import HiCacheFile, bucket_of
from hicache.backends.file_lru import USAGE_FILE
from hicache.backends.keys import object_keys
from hicache.backends.pages import PageIO
from tests.storage.conftest import fill_random, keys_for, make_host, page_bytes, poison, slots

KEYS, BATCH, HOST_PAGES = 96, 4, 16  # the multi-process tests
DIGEST = 16  # bytes of checksum at the head of each object


def _store(host: Any, root: Path, **kw: Any) -> HiCacheFile:
    store = HiCacheFile(root=root, **kw)
    store.register_mem_pool_host(host)
    return store


def _disk_bytes(root: Path) -> int:
    total = 0
    for path in root.glob("*/*.bin"):
        try:
            total += path.stat().st_size
        except FileNotFoundError:  # evicted while listing
            pass
    return total


def _files(root: Path, key: str, parts: int) -> list[Path]:
    return [root / bucket_of(key) / f"{k}.bin" for k in object_keys(key, parts)]


def _age(root: Path, key: str, parts: int, seconds: float) -> None:
    when = time.time() - seconds
    for path in _files(root, key, parts):
        os.utime(path, (when, when))


def test_objects_live_in_page_hash_buckets(tmp_path: Path) -> None:
    host = make_host("mha", "page_first")
    store = _store(host, tmp_path)
    key = keys_for(host, 1)[0]
    assert store.batch_set_v1([key], slots([0])) == [True]
    files = _files(tmp_path, key, 2)
    assert files[0].parent.name == key.split("_")[2][:2]
    tail = store.page_io().trailer_bytes
    assert [f.read_bytes()[:-tail] for f in files] == page_bytes(host, 0)
    assert sorted(p.name for p in tmp_path.glob("*/*")) == sorted(f.name for f in files)


def test_default_root_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HICACHE_STORAGE_DIR", str(tmp_path / "env"))
    assert HiCacheFile().root == str(tmp_path / "env")
    assert (tmp_path / "env").is_dir()


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"max_bytes": 0}, ValueError),
        ({"max_bytes": "1"}, TypeError),
        ({"max_bytes": True}, TypeError),
        ({"evict_ratio": 0}, ValueError),
        ({"evict_ratio": 1.5}, ValueError),
        ({"evict_ratio": "x"}, TypeError),
        ({"root": 3}, TypeError),
    ],
)
def test_bad_arguments_raise(tmp_path: Path, kw: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        HiCacheFile(**({"root": tmp_path} | kw))


def test_eviction_removes_the_least_recently_used(tmp_path: Path) -> None:
    host = make_host("mha", "page_first")
    page = 2 * _store(host, tmp_path).page_io().stored_bytes
    store = _store(host, tmp_path, max_bytes=5 * page)
    a, b, c, d, e, f = ([k] for k in keys_for(host, 6))
    assert store.batch_set_v1(a + b + c + d, slots([0, 1, 2, 3])) == [True] * 4
    for n, key in enumerate(a + b + c + d):
        _age(tmp_path, key, 2, 400 - 100 * n)  # a oldest ... d newest
    assert store.batch_get_v1(a, slots([8])) == [True]  # a read: now the newest
    assert store.batch_set_v1(e + f, slots([4, 5])) == [True, True]
    assert [store.batch_exists(k) for k in (a, b, c, d, e, f)] == [1, 0, 0, 1, 1, 1]
    stats = store.get_stats()
    assert stats["evictions"] == 3  # b's two objects, then c's oldest: down to 90% - incoming
    assert stats["bytes_used"] == _disk_bytes(tmp_path) <= 5 * page


def test_a_long_run_of_writes_stays_within_the_cap(tmp_path: Path) -> None:
    host = make_host("mla", "layer_first")
    page = _store(host, tmp_path).page_io().stored_bytes
    store = _store(host, tmp_path, max_bytes=10 * page)
    keys = keys_for(host, 60)
    for start in range(0, 60, 3):
        assert store.batch_set_v1(keys[start : start + 3], slots([0, 1, 2])) == [True] * 3
        assert store.get_stats()["bytes_used"] == _disk_bytes(tmp_path) <= 10 * page
        assert store.batch_exists(keys[start : start + 3]) == 3  # the newest are kept
    assert store.get_stats()["evictions"] >= 50


def test_pages_past_the_cap_fail_and_leave_no_temporaries(tmp_path: Path) -> None:
    host = make_host("mha", "page_head")
    page = 2 * _store(host, tmp_path).page_io().stored_bytes
    store = _store(host, tmp_path, max_bytes=2 * page)
    keys = keys_for(host, 4)
    assert store.batch_set_v1(keys, slots([0, 1, 2, 3])) == [True, True, False, False]
    assert store.batch_exists(keys) == 2
    assert not list(tmp_path.glob("*/*.tmp.*"))


def test_eviction_removes_temporaries_of_dead_writers(tmp_path: Path) -> None:
    host = make_host("mha", "page_first")
    page = 2 * _store(host, tmp_path).page_io().stored_bytes
    store = _store(host, tmp_path, max_bytes=2 * page)
    (tmp_path / "00").mkdir()
    stale, fresh = tmp_path / "00" / "x.bin.tmp.1.2.dead", tmp_path / "00" / "y.bin.tmp.1.2.live"
    for path in (stale, fresh):
        path.write_bytes(b"partial")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    assert store.batch_set_v1(keys_for(host, 3), slots([0, 1, 2])) == [True, True, False]
    assert not stale.exists() and fresh.exists()  # a writer may still be finishing that one


def test_a_lost_usage_file_is_rebuilt_from_the_directory(tmp_path: Path) -> None:
    host = make_host("mha", "page_first_direct")
    store = _store(host, tmp_path)
    keys = keys_for(host, 3)
    assert store.batch_set_v1(keys[:2], slots([0, 1])) == [True, True]
    (tmp_path / USAGE_FILE).unlink()
    assert store.batch_set_v1(keys[2:], slots([2])) == [True]
    stats = store.get_stats()
    assert (stats["objects"], stats["bytes_used"]) == (6, _disk_bytes(tmp_path))


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("damage", ["truncate", "extend"])
def test_a_corrupt_file_is_a_miss(tmp_path: Path, layout: str, damage: str) -> None:
    host = make_host("mha", layout)
    store = _store(host, tmp_path)
    keys = keys_for(host, 3)
    expected = [page_bytes(host, p * host.page_size) for p in (0, 2)]
    assert store.batch_set_v1(keys, slots([0, 1, 2])) == [True] * 3
    victim = _files(tmp_path, keys[1], 2)[1]
    size = victim.stat().st_size
    os.truncate(victim, size - 1 if damage == "truncate" else size + 1)
    poison(host)
    assert store.batch_exists(keys) == 1
    assert store.batch_get_v1(keys, slots([8, 9, 10])) == [True, False, True]
    assert [page_bytes(host, p * host.page_size) for p in (8, 10)] == expected
    assert set(b"".join(page_bytes(host, 9 * host.page_size))) == {0xA5}
    assert not victim.exists()  # removed, so it is not offered again
    assert store.batch_set_v1(keys[1:2], slots([1])) == [True]  # and can be written again


def _check_failing(store: HiCacheFile, host: Any) -> None:
    keys = keys_for(host, 2)
    for _ in range(3):
        assert store.batch_set_v1(keys, slots([0, 1])) == [False, False]
        assert store.batch_exists(keys) == 0
        assert store.batch_get_v1(keys, slots([2, 3])) == [False, False]
        store.clear()
        assert store.get_stats()["bytes_used"] == 0


def test_an_unusable_root_gives_misses_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    host = make_host("mha", "page_first")
    (tmp_path / "file").write_bytes(b"not a directory")
    with caplog.at_level(logging.WARNING, "hicache.backends.file"):
        store = _store(host, tmp_path / "file" / "store")  # construction does not raise
        _check_failing(store, host)
    messages = [r.getMessage() for r in caplog.records]
    assert messages and len(messages) == len(set(messages))  # each kind once


def test_a_root_lost_after_construction_gives_misses(tmp_path: Path) -> None:
    host = make_host("mla", "page_first")
    store = _store(host, tmp_path / "store")
    (tmp_path / "store").rmdir()
    (tmp_path / "store").write_bytes(b"now a file")
    _check_failing(store, host)


def test_threads_of_one_process_share_the_cap(tmp_path: Path) -> None:
    host = make_host("mla", "page_first_direct")
    page = len(page_bytes(host, 0)[0])
    stores = [_store(host, tmp_path, max_bytes=12 * page) for _ in range(4)]
    keys = keys_for(host, 160)

    def write(n: int) -> None:
        for start in range(n * 40, (n + 1) * 40, 2):
            stores[n].batch_set_v1(keys[start : start + 2], slots([2 * n, 2 * n + 1]))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = stores[0].get_stats()
    assert stats["bytes_used"] == _disk_bytes(tmp_path) <= 12 * page
    assert stats["objects"] == len(list(tmp_path.glob("*/*.bin")))


# -- several processes ------------------------------------------------------------------------


def _checksummed_host(seed: int) -> Any:
    """A page_first MHA pool (4 KiB objects) of random bytes, each object headed by a digest
    of the rest of it."""
    host = make_host("mha", "page_first", heads=4, dim=32, layers=4)
    fill_random(host, seed)
    pages = PageIO(host)
    for page in range(HOST_PAGES):
        for obj in pages.target(page * host.page_size):
            obj[:DIGEST] = list(hashlib.blake2b(obj[DIGEST:], digest_size=DIGEST).digest())
    return host


def _host_pages(start: int) -> list[int]:
    return [(start + i) % HOST_PAGES for i in range(BATCH)]


def writer(root: str, cap: int, seed: int, rounds: int, reverse: bool) -> None:
    """Write the ``KEYS`` pages ``rounds`` times in batches of ``BATCH`` (a child process)."""
    host = _checksummed_host(seed)
    store = _store(host, Path(root), max_bytes=cap)
    keys = keys_for(host, KEYS)
    starts = list(range(0, KEYS, BATCH))
    for _ in range(rounds):
        for start in reversed(starts) if reverse else starts:
            store.batch_set_v1(keys[start : start + BATCH], slots(_host_pages(start)))


def _spawn(*args: Any) -> Any:
    proc = multiprocessing.get_context("spawn").Process(target=writer, args=args)
    proc.start()
    return proc


def _intact(host: Any, page: int) -> bool:
    objs = PageIO(host).source(page * host.page_size)
    return all(
        bytes(o[:DIGEST]) == hashlib.blake2b(o[DIGEST:], digest_size=DIGEST).digest() for o in objs
    )


def test_processes_sharing_a_directory_stay_within_the_cap_untorn(tmp_path: Path) -> None:
    cap = 16 * 8192  # 16 pages of two 4 KiB objects, a sixth of what the writers write
    tolerance = 2 * BATCH * 8192  # a scan from outside may count one batch per writer twice
    procs = [_spawn(str(tmp_path), cap, seed, 2, seed == 2) for seed in (1, 2)]
    reader_host = _checksummed_host(0)
    reader = _store(reader_host, tmp_path, max_bytes=cap)
    keys, rng = keys_for(reader_host, KEYS), random.Random(0)
    hits = peak = 0
    while any(p.is_alive() for p in procs) or hits == 0:
        poison(reader_host)
        start = rng.randrange(0, KEYS - BATCH)
        got = reader.batch_get_v1(keys[start : start + BATCH], slots([0, 1, 2, 3]))
        assert all(_intact(reader_host, p) for p in range(BATCH) if got[p])  # never torn
        hits += sum(got)
        peak = max(peak, _disk_bytes(tmp_path))
        time.sleep(0.002)  # leave the writers the CPU on a small machine
        assert all(p.exitcode in (None, 0) for p in procs)
    for proc in procs:
        proc.join()
    assert [p.exitcode for p in procs] == [0, 0]
    stats = reader.get_stats()
    assert stats["bytes_used"] == _disk_bytes(tmp_path) <= cap  # exact once writers are done
    assert peak <= cap + tolerance
    assert stats["evictions"] > 0 and hits > 0


def test_pages_outlive_the_process_that_wrote_them(tmp_path: Path) -> None:
    proc = _spawn(str(tmp_path), 1 << 30, 3, 1, False)
    proc.join()
    assert proc.exitcode == 0
    expected = _checksummed_host(3)  # the writer's pool, rebuilt
    host = _checksummed_host(4)
    poison(host)
    store = _store(host, tmp_path)
    keys = keys_for(host, KEYS)
    assert store.batch_exists(keys) == KEYS
    for start in range(0, KEYS, BATCH):
        assert store.batch_get_v1(keys[start : start + BATCH], slots([8, 9, 10, 11])) == [True] * 4
        want = [page_bytes(expected, p * 4) for p in _host_pages(start)]
        assert [page_bytes(host, p * 4) for p in (8, 9, 10, 11)] == want
