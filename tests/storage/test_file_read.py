"""``file_read.read_pages``: the C function (``hicache.backends.cfile``) against its Python twin
on the same files (hits, missing objects, wrong sizes, read errors, short reads, pages of two
objects, the LRU touch, bad arguments), and the file store's handling of each outcome on both
paths."""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hicache.backends import file
from hicache.backends.file import HiCacheFile
from hicache.backends.file_read import NATIVE_READ, Step, python_read_pages, read_pages

from .conftest import PAGE, keys_for, make_host, page_bytes, slots

STORED, TRAILER = 96, 16
OLD_NS = 10**18  # 2001: an mtime a read with stale_ns = now touches
PATHS = {"python": python_read_pages, "c": read_pages}
native = pytest.mark.skipif(not NATIVE_READ, reason="hicache.backends.cfile not built")


def _object(path: Path, size: int = STORED, seed: int = 0) -> Path:
    path.write_bytes(np.random.default_rng(seed).integers(0, 256, size, np.uint8).tobytes())
    os.utime(path, ns=(OLD_NS, OLD_NS))
    return path


def _run(fn: Callable[..., Any], paths: list[Path], parts: int = 1, stored: int = STORED) -> Any:
    """``fn``'s outcomes and buffers (poisoned first) for ``paths``; mtimes set old first."""
    buffers = []
    for p in paths:
        if p.exists():
            os.utime(p, ns=(OLD_NS, OLD_NS))
        buffers += [bytearray(b"\xa5" * (stored - TRAILER)), bytearray(b"\xa5" * TRAILER)]
    outcomes = fn([str(p) for p in paths], buffers, stored, parts, time.time_ns() - 10**9)
    return [tuple(o) for o in outcomes], [bytes(b) for b in buffers]


def _agree(paths: list[Path], parts: int = 1, stored: int = STORED) -> list[tuple[int, ...]]:
    """The outcomes, after checking that C and Python give the same ones and the same bytes."""
    c_out, py_out = (_run(PATHS[n], paths, parts, stored) for n in ("c", "python"))
    assert c_out == py_out
    return c_out[0]


@native
def test_hits_read_every_byte_and_touch_stale_objects(tmp_path: Path) -> None:
    paths = [_object(tmp_path / f"{i}.bin", seed=i) for i in range(3)]
    outcomes, buffers = _run(read_pages, paths)
    assert outcomes == [(Step.READ_OK, STORED, 1)] * 3
    assert [buffers[2 * i] + buffers[2 * i + 1] for i in range(3)] == [
        p.read_bytes() for p in paths
    ]
    assert all(p.stat().st_mtime_ns > OLD_NS for p in paths)
    assert _agree(paths) == outcomes
    fresh = read_pages(
        [str(paths[0])], [bytearray(STORED - TRAILER), bytearray(TRAILER)], STORED, 1, 0
    )
    assert fresh == [(Step.READ_OK, STORED, 0)]  # a fresh mtime is left alone


@native
def test_missing_wrong_size_and_unopenable_objects(tmp_path: Path) -> None:
    ok = _object(tmp_path / "ok.bin")
    short = _object(tmp_path / "short.bin", STORED - 5)
    paths = [tmp_path / "gone.bin", short, ok / "below_a_file.bin", ok]
    assert _agree(paths) == [
        (Step.OPEN_FAILED, errno.ENOENT, 0),
        (Step.WRONG_SIZE, STORED - 5, 0),
        (Step.OPEN_FAILED, errno.ENOTDIR, 0),
        (Step.READ_OK, STORED, 1),
    ]


@native
def test_a_read_error_is_its_errno(tmp_path: Path) -> None:
    folder = tmp_path / "folder.bin"  # opens, and its size is what the reader expects
    folder.mkdir()
    size = folder.stat().st_size
    assert _agree([folder], stored=size) == [(Step.READ_FAILED, errno.EISDIR, 1)]


def _sysfs_file() -> Path | None:
    """A sysfs file: its size says 4096 bytes, a read gives fewer (a short read)."""
    for name in ("kernel/mm/transparent_hugepage/enabled", "kernel/profiling", "power/state"):
        path = Path("/sys") / name
        if path.is_file() and os.access(path, os.R_OK) and path.stat().st_size == 4096:
            return path
    return None


@native
def test_a_short_read_is_the_bytes_read() -> None:
    path = _sysfs_file()
    if path is None:
        pytest.skip("no readable sysfs file of 4096 bytes")
    got = len(path.read_bytes())
    outcomes, _ = _run(read_pages, [path], stored=4096)
    assert outcomes[0][:2] == (Step.SHORT_READ, got)
    assert _agree([path], stored=4096)[0][:2] == (Step.SHORT_READ, got)


@native
def test_a_page_reads_nothing_unless_all_its_objects_open(tmp_path: Path) -> None:
    k, v, k2, v2 = (_object(tmp_path / f"{i}.bin", seed=i) for i in range(4))
    gone = tmp_path / "gone.bin"
    outcomes = _agree([k, gone, gone, v, k2, v2], parts=2)
    assert outcomes == [
        (Step.OPENED, 0, 1),
        (Step.OPEN_FAILED, errno.ENOENT, 0),
        (Step.OPEN_FAILED, errno.ENOENT, 0),
        (Step.NOT_TRIED, 0, 0),
        (Step.READ_OK, STORED, 1),
        (Step.READ_OK, STORED, 1),
    ]
    _, buffers = _run(read_pages, [k, gone], parts=2)
    assert set(b"".join(buffers)) == {0xA5}  # the opened object was not read either


@pytest.mark.parametrize("fn", PATHS.values(), ids=PATHS.keys())
@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("p", [], STORED, 1), TypeError),
        ((["p"], [bytearray(80)], STORED, 1), ValueError),
        ((["p", "q"], [bytearray(80)] * 4, STORED, 3), ValueError),
        ((["p"], [bytearray(80), bytearray(16)], -1, 1), ValueError),
        (([b"p"], [bytearray(80), bytearray(16)], STORED, 1), TypeError),
        ((["p"], [bytes(80), bytearray(16)], STORED, 1), BufferError),
        ((["p"], [bytearray(80), bytearray(17)], STORED, 1), ValueError),
    ],
)
def test_bad_arguments_raise_before_any_io(fn: Callable[..., Any], args: Any, error: Any) -> None:
    if fn is read_pages and not NATIVE_READ:
        pytest.skip("hicache.backends.cfile not built")
    with pytest.raises(error):
        fn(*args, 0)


@pytest.fixture(params=list(PATHS), ids=list(PATHS))
def reads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The file store's reads on the C path, then on the Python one."""
    if request.param == "c" and not NATIVE_READ:
        pytest.skip("hicache.backends.cfile not built")
    monkeypatch.setattr(file, "read_pages", PATHS[request.param])
    return str(request.param)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_batch_in_chunks_reads_back_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads: str, threads: int
) -> None:
    host = make_host("mha", "page_first")  # two objects a page
    store = HiCacheFile(tmp_path / "store", max_bytes=1 << 30, read_threads=threads)
    store.register_mem_pool_host(host)
    monkeypatch.setattr(file, "READ_CHUNK_BYTES", 1)  # a page a chunk: several chunks
    keys = keys_for(host, 5)
    assert store.batch_set_v1(keys, slots(list(range(5)))) == [True] * 5
    assert store.batch_get_v1(keys, slots(list(range(8, 13)))) == [True] * 5
    assert [page_bytes(host, PAGE * s) for s in range(8, 13)] == [
        page_bytes(host, PAGE * s) for s in range(5)
    ]
    assert store.faults.counts() == {}
    store.close()


def _faked(monkeypatch: pytest.MonkeyPatch, change: Callable[[tuple[int, ...]], tuple]) -> None:
    """The store's reads return the Python outcomes, the first one's changed by ``change``."""

    def fake(*args: Any) -> list[tuple[int, ...]]:
        first, *rest = python_read_pages(*args)
        return [change(tuple(first)), *rest]

    monkeypatch.setattr(file, "read_pages", fake)


@pytest.mark.parametrize(
    ("change", "hit", "faults"),
    [
        (lambda o: (o[0], o[1], -errno.EROFS), True, {"io_EROFS": 1}),
        (lambda o: (Step.READ_FAILED, errno.EIO, 0), False, {"io_EIO": 1}),
        (lambda o: (Step.SHORT_READ, 7, 0), False, {"io_error": 1}),
        (lambda o: (Step.OPEN_FAILED, errno.ENOENT, 0), False, {}),
    ],
    ids=["touch failed", "EIO", "short read", "missing"],
)
def test_outcomes_become_hits_misses_and_faults(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    change: Callable[[tuple[int, ...]], tuple],
    hit: bool,
    faults: dict[str, int],
) -> None:
    host = make_host("mha", "page_first")
    store = HiCacheFile(tmp_path / "store", max_bytes=1 << 30)
    store.register_mem_pool_host(host)
    keys = keys_for(host, 1)
    assert store.batch_set_v1(keys, slots([0])) == [True]
    _faked(monkeypatch, change)
    with caplog.at_level(logging.WARNING, "hicache.backends.file"):
        assert store.batch_get_v1(keys, slots([8])) == [hit]
    assert store.faults.counts() == faults
    assert store.failure_count() == (0 if hit else sum(faults.values()))
