"""The byte cap of a file store directory, shared by every process and thread that uses it.

``{root}/.hicache_usage`` holds three little-endian int64 counters (bytes of committed objects,
objects, evictions so far) and is the lock: a writer takes ``fcntl.flock(LOCK_EX)`` on its own
open of the file (so threads of one process exclude each other too, and a fork shares nothing),
reads the counters, makes room, renames its finished temporary files into place and adds them,
writes the counters back and unlocks. Every rename into the store happens under the lock, so
the committed bytes never pass the cap; temporaries being written (at most one batch per
writer) are outside it. No directory is scanned on the write path unless the cap is reached:
then the oldest objects by mtime (the LRU clock: readers ``os.utime`` on every hit) are removed
until ``ratio * cap`` minus the incoming bytes remains, and the counters are reset to what the
scan found (which also repairs drift from files removed by hand or a writer killed between its
rename and its counter update). A missing or short usage file is rebuilt by one scan.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = [
    "DEFAULT_MAX_BYTES",
    "USAGE_FILE",
    "DirectoryUsage",
    "Ledger",
    "default_cap",
    "discard",
    "scan_objects",
    "write_temporary",
]

DEFAULT_MAX_BYTES = 64 << 30  # or half the free disk space at construction, if less


def default_cap(root: str) -> int:
    """The default byte cap of a store at ``root``: ``DEFAULT_MAX_BYTES``, or half the free
    space of its file system if less."""
    try:
        return max(1, min(DEFAULT_MAX_BYTES, shutil.disk_usage(root).free // 2))
    except OSError:
        return DEFAULT_MAX_BYTES


USAGE_FILE = ".hicache_usage"
OBJECT_SUFFIX = ".bin"
TMP_MARK = ".tmp."
STALE_TMP_S = 600.0  # a temporary this old belongs to a writer that died; the scan removes it
_COUNTERS = struct.Struct("<qqq")


@dataclass
class Ledger:
    """The counters of a directory, read under its lock; changes are written back on release."""

    used: int
    objects: int
    evictions: int


def scan_objects(root: str) -> list[tuple[int, int, str]]:
    """``(mtime_ns, bytes, path)`` of every object under ``root``'s buckets; stale temporaries
    are removed on the way. ``OSError`` if ``root`` cannot be listed."""
    found = []
    stale_ns = time.time_ns() - int(STALE_TMP_S * 1e9)
    with os.scandir(root) as buckets:
        dirs = [b.path for b in buckets if b.is_dir(follow_symlinks=False)]
    for bucket in dirs:
        with os.scandir(bucket) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                    if entry.name.endswith(OBJECT_SUFFIX):
                        found.append((st.st_mtime_ns, st.st_size, entry.path))
                    elif TMP_MARK in entry.name and st.st_mtime_ns < stale_ns:
                        os.unlink(entry.path)
                except FileNotFoundError:  # removed by another process meanwhile
                    continue
    return found


class DirectoryUsage:
    """The shared counters and LRU eviction of the store under ``root``; see the module
    docstring. ``ratio`` (0 < ratio <= 1): the fraction of a cap an eviction leaves."""

    def __init__(self, root: str, ratio: float = 0.9) -> None:
        self.root = root
        self.path = os.path.join(root, USAGE_FILE)
        self.ratio = ratio

    @contextmanager
    def locked(self, shared: bool = False) -> Iterator[Ledger]:
        """The counters under the lock (``shared``: read-only, ``LOCK_SH``). ``OSError`` on a
        failing file system."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            raw = os.pread(fd, _COUNTERS.size, 0)
            if len(raw) == _COUNTERS.size:
                ledger = Ledger(*_COUNTERS.unpack(raw))
            else:  # new directory, or a usage file lost: count what is there
                ledger = Ledger(0, 0, 0)
                if not shared:
                    self._resync(ledger, scan_objects(self.root))
            before = _COUNTERS.pack(ledger.used, ledger.objects, ledger.evictions)
            try:
                yield ledger
            finally:  # also after a failure midway: the counters say what was done
                after = _COUNTERS.pack(ledger.used, ledger.objects, ledger.evictions)
                if not shared and after != before:
                    os.pwrite(fd, after, 0)
        finally:
            os.close(fd)  # closing releases the lock

    def make_room(self, ledger: Ledger, incoming: int, cap: int) -> list[str]:
        """Under ``locked()``: when ``incoming`` more bytes would pass ``cap``, evict the least
        recently used objects down to ``ratio * cap - incoming`` bytes (at least 0); returns
        the paths removed."""
        if ledger.used + incoming <= cap:
            return []
        objects = sorted(scan_objects(self.root))
        total = sum(size for _, size, _ in objects)
        goal = max(0, int(self.ratio * cap) - incoming)
        evicted = 0
        while evicted < len(objects) and total > goal:
            _, size, path = objects[evicted]
            discard([path])
            total -= size
            evicted += 1
        ledger.evictions += evicted
        self._resync(ledger, objects[evicted:])
        return [path for _, _, path in objects[:evicted]]

    def _resync(self, ledger: Ledger, objects: list[tuple[int, int, str]]) -> None:
        ledger.used = sum(size for _, size, _ in objects)
        ledger.objects = len(objects)

    def clear(self) -> None:
        """Remove every object under the lock; evictions stay counted."""
        with self.locked() as ledger:
            for _, _, path in scan_objects(self.root):
                discard([path])
            ledger.used = ledger.objects = 0


def discard(paths: list[str]) -> None:
    """Remove ``paths``, ignoring any that are gone (another process, a reader: corrupt) or
    that the file system fails to remove (nothing more to do)."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def write_temporary(final: str, buffers: list[memoryview | bytes]) -> str:
    """Write ``buffers`` to a new unique temporary beside ``final``
    (``{final}{TMP_MARK}{pid}.{thread}.{uuid}``, its directory made if missing); its path.
    Raises ``OSError`` (a short write too), leaving no temporary behind."""
    tmp = f"{final}{TMP_MARK}{os.getpid()}.{threading.get_ident()}.{uuid.uuid4().hex}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileNotFoundError:  # the bucket is new
        os.makedirs(os.path.dirname(tmp), exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        try:
            written = os.writev(fd, buffers)
        finally:
            os.close(fd)
        expected = sum(len(memoryview(b).cast("B")) for b in buffers)
        if written != expected:
            raise OSError(f"short write: {written} of {expected} bytes")
    except OSError:
        discard([tmp])
        raise
    return tmp
