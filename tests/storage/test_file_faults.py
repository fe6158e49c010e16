"""File-store faults are counted by kind where an operator looks (the guard's ``stats()``:
``failures`` and ``faults``) and logged once per kind: ENOSPC, EROFS and EIO injected into
the file system calls, and truncated objects."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from hicache.backends import file, file_lru
from hicache.backends.faults import FaultLog, io_kind
from hicache.backends.file import HiCacheFile
from hicache.backends.file_read import python_read_pages
from hicache.backends.guard import GuardedStorage

from .conftest import keys_for, make_host, slots

PAGES, CALLS = 2, 3
FILE_LOG = "hicache.backends.file"


def _guarded(tmp_path: Path) -> tuple[GuardedStorage, Any]:
    host = make_host("mha", "page_first")  # two objects (K, V) per page
    store = GuardedStorage(HiCacheFile(tmp_path / "store", max_bytes=1 << 30), "file")
    store.register_mem_pool_host(host)
    return store, host


def _fail_creating(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """Creating a file (the writer's temporaries) raises ``OSError(code)``: a full or
    read-only file system."""

    real_open = os.open

    def failing_open(path: str, flags: int, *args: Any, **kw: Any) -> Any:
        if flags & os.O_CREAT:
            raise OSError(code, os.strerror(code), path)
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(file_lru.os, "open", failing_open)


def _lines(caplog: pytest.LogCaptureFixture, kind: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f": {kind} (" in r.getMessage()]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_write_fault_is_counted_by_errno_and_logged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    store, host = _guarded(tmp_path)
    keys = keys_for(host, PAGES)
    _fail_creating(monkeypatch, code)
    with caplog.at_level(logging.WARNING, FILE_LOG):
        for _ in range(CALLS):
            assert store.batch_set_v1(keys, slots(list(range(PAGES)))) == [False] * PAGES
    kind = f"io_{errno.errorcode[code]}"
    stats = store.stats()
    # a write batch stops at its first failed page (no holes): one fault per call
    assert (stats.failures, stats.faults) == (CALLS, {kind: CALLS})
    assert len(_lines(caplog, kind)) == 1


def test_a_read_fault_is_counted_and_logged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store, host = _guarded(tmp_path)
    keys = keys_for(host, PAGES)
    assert store.batch_set_v1(keys, slots(list(range(PAGES)))) == [True] * PAGES

    def eio(fd: int, buffers: Any) -> int:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    # the Python reads, whose os.readv this replaces (test_file_read: C and Python agree)
    monkeypatch.setattr(file, "read_pages", python_read_pages)
    monkeypatch.setattr(os, "readv", eio)
    with caplog.at_level(logging.WARNING, FILE_LOG):
        for _ in range(CALLS):
            assert store.batch_get_v1(keys, slots(list(range(8, 8 + PAGES)))) == [False] * PAGES
    stats = store.stats()
    assert (stats.failures, stats.faults) == (CALLS, {"io_EIO": CALLS * PAGES})
    assert len(_lines(caplog, "io_EIO")) == 1


def test_a_truncated_object_is_a_counted_corrupt_object(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, host = _guarded(tmp_path)
    keys = keys_for(host, CALLS)
    assert store.batch_set_v1(keys, slots(list(range(CALLS)))) == [True] * CALLS
    for victim in sorted((tmp_path / "store").glob("*/*.bin")):
        os.truncate(victim, victim.stat().st_size // 2)
    with caplog.at_level(logging.WARNING, FILE_LOG):
        for key in keys:
            assert store.batch_get_v1([key], slots([8])) == [False]
    stats = store.stats()
    assert (stats.failures, stats.faults) == (CALLS, {"corrupt_object": CALLS})
    assert len(_lines(caplog, "corrupt_object")) == 1


def test_a_failed_touch_is_counted_but_fails_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, host = _guarded(tmp_path)
    keys = keys_for(host, 1)
    assert store.batch_set_v1(keys, slots([0])) == [True]

    def eperm(path: Any, *args: Any, **kw: Any) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "utime", eperm)
    assert store.batch_set_v1(keys, slots([0])) == [True]  # present: touched instead
    stats = store.stats()
    assert (stats.failures, stats.faults) == (0, {"io_EPERM": host.parts})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_repeats_are_logged_at_most_once_per_interval_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    faults = FaultLog(logging.getLogger("test.faults"), "store x", interval_s=10, clock=clock)
    with caplog.at_level(logging.WARNING, "test.faults"):
        for t in (0, 1, 2, 9, 10, 11, 25):
            clock.now = t
            faults.record("io_EIO", "read failed")
        faults.record("corrupt_object", "3 bytes")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4  # io_EIO at 0, 10 and 25; corrupt_object at once
    assert "3 more since the last line" in lines[1] and "1 more since" in lines[2]
    assert faults.counts() == {"io_EIO": 7, "corrupt_object": 1}
    assert faults.failure_count() == 8


@pytest.mark.parametrize(
    ("err", "kind"),
    [(OSError(errno.ENOSPC, "full"), "io_ENOSPC"), (OSError("short write"), "io_error")],
)
def test_io_kind_names_the_errno(err: OSError, kind: str) -> None:
    assert io_kind(err) == kind


@pytest.mark.parametrize(("interval", "error"), [(0, ValueError), ("1", TypeError)])
def test_a_bad_interval_raises(interval: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="interval_s"):
        FaultLog(logging.getLogger("x"), "x", interval_s=interval)
