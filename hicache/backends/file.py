"""HiCacheFile: the embedded store, one file per page object in a directory on this machine.

An object lives at ``{root}/{bucket}/{object key}.bin``, ``bucket`` being the first two hex
characters of the page hash in the key (a 256-way fan-out; a key of another shape is bucketed
by a hash of itself). Writes go to a unique temporary (``{final}.tmp.{pid}.{thread}.{uuid}``),
then ``os.replace`` renames it into place, so a reader sees a whole object or none, from any
process. A present object is never rewritten (write-once); it is touched instead
(``os.utime``), as on a read hit (when its mtime is over a minute old): mtime is the LRU clock
that every process using the directory shares. An object is its payload and its trailer
(``page_sum``). Reads ``readv`` the payload into the host page itself when ``PageIO.zero_copy``
(else a staging array, then ``commit``) and the trailer beside it, in one call, after
``fstat`` checks the file's size: a batch in chunks on ``read_threads`` threads, each chunk's
system calls one ``file_read.read_pages`` call (in C, the GIL released, when built), then each
page's trailer checked; a file of the wrong size, or one that fails its trailer's check, is
corrupt: a miss, counted, and removed. The byte cap is shared by every instance on the
directory (``file_lru``). Any ``OSError`` after construction is a miss, counted by kind.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import time
from itertools import chain
from typing import Any

from hicache import env
from hicache.backends.base import PageStore
from hicache.backends.fanout import DEFAULT_THREADS, Fanout
from hicache.backends.faults import io_kind
from hicache.backends.file_lru import (
    OBJECT_SUFFIX,
    DirectoryUsage,
    Ledger,
    default_cap,
    discard,
    write_temporary,
)
from hicache.backends.file_read import Step, read_pages
from hicache.backends.keys import KEY_VERSION, object_keys
from hicache.backends.pages import PageIO
from hicache.checks import check_int

__all__ = ["DEFAULT_ROOT", "HiCacheFile", "bucket_of"]

logger = logging.getLogger(__name__)

DEFAULT_ROOT = "/tmp/hicache"
# a read chunk at most (one C call, then its checks): a long batch pipelines (one chunk's hashes
# hold the GIL while others read); a chunk's task overhead (~20 us) is a few percent of it
READ_CHUNK_BYTES = 2 << 20
TOUCH_AFTER_NS = 60 * 10**9  # a hit leaves an mtime younger than this: LRU resolution, 1 min
_PAGE_HASH = re.compile(KEY_VERSION + r"_[0-9a-f]{16}_([0-9a-f]{2})")
Staged = list[tuple[str, str]]  # (temporary, final path) of each object a page still needs


class HiCacheFile(PageStore):
    """A directory of page objects under a byte cap with LRU eviction; see the module docstring.

    Parameters
    ----------
    root : the directory (created if missing); default ``$HICACHE_STORAGE_DIR``, else
        ``/tmp/hicache``. Instances sharing it (any process) share objects and the cap.
    max_bytes : the cap on the bytes of committed objects (>= 1); default the lesser of
        64 GiB and half the free space of ``root``'s file system.
    evict_ratio : the fraction of ``max_bytes`` an eviction leaves, in (0, 1].
    read_threads : threads reading a batch's pages in parallel, in chunks of at most
        ``READ_CHUNK_BYTES`` (>= 1; 1: the calling thread).
    """

    medium = "DISK"

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        max_bytes: int | None = None,
        evict_ratio: float = 0.9,
        read_threads: int = DEFAULT_THREADS,
    ) -> None:
        if root is not None and not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a path, got {type(root).__name__}")
        if max_bytes is not None:
            check_int("max_bytes", max_bytes, minimum=1)
        if isinstance(evict_ratio, bool) or not isinstance(evict_ratio, (int, float)):
            raise TypeError(f"evict_ratio must be a number, got {type(evict_ratio).__name__}")
        if not 0 < evict_ratio <= 1:
            raise ValueError(f"evict_ratio must be in (0, 1], got {evict_ratio}")
        self._readers = Fanout(read_threads, "hicache-file-read")
        self.root = os.path.abspath(os.fspath(root if root is not None else _default_root()))
        super().__init__(f"file store {self.root}")
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as err:  # every call will miss; serving goes on without the tier
            self._fail("create root", err)
        self.max_bytes = max_bytes if max_bytes is not None else default_cap(self.root)
        self.usage = DirectoryUsage(self.root, float(evict_ratio))

    def _paths(self, page_key: str, names: list[str]) -> list[str]:
        """Where the objects ``names`` (``object_keys``) of page ``page_key`` live (f-strings:
        this is the hot path)."""
        base = f"{self.root}/{bucket_of(page_key)}/"
        return [f"{base}{k}{OBJECT_SUFFIX}" for k in names]

    def _count_present(self, pages: PageIO, keys: list[str]) -> int:
        for i, key in enumerate(keys):
            paths = self._paths(key, object_keys(key, pages.parts))
            if self.closed or not self._present(paths, pages):
                return i
        return len(keys)

    def _present(self, paths: list[str], pages: PageIO) -> bool:
        return all(self._size(p) == pages.stored_bytes for p in paths)

    def _size(self, path: str) -> int:
        """The file's size, -1 if it is missing or cannot be read."""
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            return -1
        except OSError as err:
            self._fail("stat", err)
            return -1

    def _read_pages(self, pages: PageIO, keys: list[str], slots: list[int]) -> list[bool]:
        stale = time.time_ns() - TOUCH_AFTER_NS  # an object whose mtime is older is touched
        most = max(1, READ_CHUNK_BYTES // (pages.stored_bytes * pages.parts))
        chunk = min(most, -(-len(keys) // self._readers.threads))  # a chunk a thread at least
        return self._readers.map_chunks(
            lambda batch: self._read_chunk(pages, batch, stale),
            list(zip(keys, slots, strict=True)),
            chunk,
        )

    def _read_chunk(self, pages: PageIO, batch: list[tuple[str, int]], stale_ns: int) -> list[bool]:
        """Read a chunk of ``(key, slot)`` pages (``file_read.read_pages``: one call, the GIL
        released in C), then settle each: a page is a hit when every object read whole and
        passed its trailer's check. A missing object leaves the page's host slots as they were
        (one that fails leaves them unspecified: the caller does not adopt them)."""
        parts = pages.parts
        names = [object_keys(key, parts) for key, _ in batch]
        paths = [p for (key, _), n in zip(batch, names, strict=True) for p in self._paths(key, n)]
        targets = [pages.target(slot) for _, slot in batch]
        trailers = [bytearray(pages.trailer_bytes) for _ in paths]
        buffers = [b for obj in zip(chain(*targets), trailers, strict=True) for b in obj]
        outcomes = read_pages(paths, buffers, pages.stored_bytes, parts, stale_ns)
        done = []
        for i, (_, slot) in enumerate(batch):
            objects = slice(i * parts, (i + 1) * parts)
            ok = self._settled(paths[objects], outcomes[objects], pages.stored_bytes)
            if ok and not self._accepted(pages, names[i], slot, targets[i], trailers[objects]):
                self._remove(paths[objects])  # it failed its trailer's check
                ok = False
            if ok:
                pages.commit(slot, targets[i])
            done.append(ok)
        return done

    def _settled(self, paths: list[str], outcomes: list[tuple[int, int, int]], stored: int) -> bool:
        """Count the faults of one page's ``outcomes``; whether every object was read whole."""
        for path, (step, value, touch) in zip(paths, outcomes, strict=True):
            if touch < 0:  # e.g. another user's file: it ages, nothing breaks
                err = OSError(-touch, os.strerror(-touch), path)
                self.faults.record(io_kind(err), f"touch: {err}", failed=False)
            if step == Step.WRONG_SIZE:  # removed, so that batch_exists stops offering it
                self.faults.record("corrupt_object", f"{path}: {value} bytes, {stored} expected")
                self._remove([path])
            elif step in (Step.OPEN_FAILED, Step.READ_FAILED) and value != errno.ENOENT:
                self._fail("read", OSError(value, os.strerror(value), path))
            elif step == Step.SHORT_READ:
                self._fail("read", OSError(f"short read: {value} of {stored} bytes"))
        return all(step == Step.READ_OK for step, _, _ in outcomes)

    def _touch(self, files: list[str]) -> None:
        """Set the mtime of each path to now; best effort (the LRU clock)."""
        for file in files:
            try:
                os.utime(file)
            except FileNotFoundError:  # evicted meanwhile
                pass
            except OSError as err:  # e.g. another user's file: it ages, nothing breaks
                self.faults.record(io_kind(err), f"touch: {err}", failed=False)

    def _write_pages(self, pages: PageIO, keys: list[str], slots: list[int]) -> list[bool]:
        done = [False] * len(keys)
        staged: dict[int, Staged] = {}
        for i, (key, slot) in enumerate(zip(keys, slots, strict=True)):
            names = object_keys(key, pages.parts)
            paths = self._paths(key, names)
            try:
                objects = zip(paths, names, pages.source(slot), strict=True)
                missing = [(p, n, a) for p, n, a in objects if not self._present([p], pages)]
                if not missing:
                    self._touch(paths)
                    done[i] = True
                    continue
                staged[i] = []  # filled as written, so a failure can discard what was
                for final, name, data in missing:
                    tail = pages.trailer(name, slot, data)
                    staged[i].append((write_temporary(final, [data.data, tail]), final))
            except OSError as err:
                self._fail("write", err)
                discard([tmp for tmp, _ in staged.pop(i, [])])
                break  # a prefix: a later page without this one would be a hole
        self._commit(staged, pages.stored_bytes, done)
        return done

    def _commit(self, staged: dict[int, Staged], nbytes: int, done: list[bool]) -> None:
        """Rename the staged pages into place under the directory lock, in order, each only
        if it fits the cap after eviction; set ``done[i]`` for each page placed."""
        if not staged:
            return
        incoming = nbytes * sum(len(objs) for objs in staged.values())
        try:
            with self.usage.locked() as ledger:
                self._report(self.usage.make_room(ledger, incoming, self.max_bytes))
                for i, objs in staged.items():
                    done[i] = self._place(ledger, objs, nbytes)
        except OSError as err:
            self._fail("commit", err)
        finally:
            discard([tmp for i, objs in staged.items() if not done[i] for tmp, _ in objs])

    def _place(self, ledger: Ledger, objs: Staged, nbytes: int) -> bool:
        if ledger.used + nbytes * len(objs) > self.max_bytes:
            return False
        for tmp, final in objs:
            if self._size(final) == nbytes:  # a racing writer placed it: keep the first
                discard([tmp])
                continue
            os.replace(tmp, final)
            ledger.used += nbytes
            ledger.objects += 1
        return True

    def _remove(self, paths: list[str]) -> None:
        discard(paths)
        self._report(paths)

    def _report(self, paths: list[str]) -> None:
        """Tell ``on_evict`` the page keys of the removed objects ``paths``."""
        if self.on_evict is not None and paths:
            names = (os.path.basename(p).removesuffix(OBJECT_SUFFIX) for p in paths)
            self.on_evict(list(dict.fromkeys(n.rsplit("_", 1)[0] for n in names)))

    def clear(self) -> None:
        try:
            self.usage.clear()
        except OSError as err:
            self._fail("clear", err)

    def get_stats(self) -> dict[str, Any]:
        """``{"backend", "root", "bytes_used", "objects", "max_bytes", "evictions"}`` of the
        whole directory (every instance sharing it); zeros when it cannot be read."""
        stats: dict[str, Any] = {"backend": "file", "root": self.root, "max_bytes": self.max_bytes}
        try:
            with self.usage.locked(shared=True) as ledger:
                used, objects, evictions = ledger.used, ledger.objects, ledger.evictions
        except OSError as err:
            self._fail("stats", err)
            used = objects = evictions = 0
        return stats | {"bytes_used": used, "objects": objects, "evictions": evictions}

    def close(self) -> None:
        """Later calls are misses; the directory and its objects stay for other instances."""
        self.closed = True
        self._readers.close()

    def failure_count(self) -> int:
        """Faults that failed a call, all but touches (``guard.ReportsFailures``)."""
        return self.faults.failure_count()

    def _fail(self, op: str, err: OSError) -> None:
        self.faults.record(io_kind(err), f"{op}: {err}")


def bucket_of(page_key: str) -> str:
    """The bucket (two hex characters) of a page: the first byte of its page hash, or of a
    hash of the key for a key of another shape."""
    found = _PAGE_HASH.match(page_key)
    if found:
        return found.group(1)
    return hashlib.blake2b(page_key.encode(), digest_size=1).hexdigest()


def _default_root() -> str:
    return env.storage_dir() or DEFAULT_ROOT
