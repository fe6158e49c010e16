"""The file store's page reads as system calls: ``read_pages``, in C when built, else Python.

``read_pages(paths, buffers, stored, parts, stale_ns)`` reads a chunk of a batch: ``paths``
grouped by page (``parts`` objects each), two writable buffers per object (payload, then
trailer; ``stored`` bytes together). For each page it opens every object, checks its size
(``fstat``: it must be ``stored``) and touches it when its mtime is older than ``stale_ns``
(the LRU clock every process shares), then, only when every object passed, ``readv``s each
into its buffers and closes them; a page stops at its first failing object, so a missing
object leaves the page's buffers as they were. It returns one ``Outcome`` per object and
raises nothing for I/O: the caller turns outcomes into hits, misses and faults.

The C function (``hicache.backends.cfile``, built by the install where a C compiler is there;
``setup.py``) runs the whole chunk's system calls without the GIL, so the file store's read
threads keep several reads in flight and hand the GIL over once per chunk rather than once per
system call. ``python_read_pages`` is its twin (same outcomes, same buffer contents, same
errors for bad arguments), used when the extension is not built.
"""

from __future__ import annotations

import enum
import errno
import os
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["NATIVE_READ", "Outcome", "Step", "python_read_pages", "read_pages"]


class Step(enum.IntEnum):
    """How far the read of one object got (``value``: what ``Outcome.value`` then holds)."""

    NOT_TRIED = 0  # an earlier object of its page failed; value 0
    OPEN_FAILED = 1  # open or fstat raised; value errno
    WRONG_SIZE = 2  # value: its size
    OPENED = 3  # passed, not read (a later object of its page failed); value 0
    READ_FAILED = 4  # value errno
    SHORT_READ = 5  # value: bytes read, fewer than stored
    READ_OK = 6  # value: stored


class Outcome(NamedTuple):
    """One object's read: ``step`` (a ``Step``), its ``value``, and ``touch``: 0 when its
    mtime was fresh, 1 when touched, ``-errno`` when the touch failed."""

    step: int
    value: int
    touch: int


ReadPages = Callable[[list[str], list[Any], int, int, int], list[tuple[int, int, int]]]


def _check(paths: list[str], buffers: list[Any], stored: int, parts: int) -> None:
    """The C function's argument checks, in its order, with its exception types."""
    if type(paths) is not list or type(buffers) is not list:
        raise TypeError("paths and buffers must be lists")
    n = len(paths)
    if parts < 1 or stored < 0 or n % parts or len(buffers) != 2 * n:
        raise ValueError(
            f"read_pages needs parts >= 1 dividing len(paths) ({n}), stored >= 0 and two "
            f"buffers per path, got parts {parts}, stored {stored}, {len(buffers)} buffers"
        )
    for path in paths:
        if not isinstance(path, str):
            raise TypeError(f"paths must hold str, got {type(path).__name__}")
    views = [memoryview(b) for b in buffers]
    for b in views:
        if b.readonly or not b.c_contiguous:
            raise BufferError("buffers must be writable and C-contiguous")
    for k in range(n):
        held = views[2 * k].nbytes + views[2 * k + 1].nbytes
        if held != stored:
            raise ValueError(f"buffers of object {k} hold {held} bytes, stored is {stored}")


def _open_sized(path: str, stored: int, stale_ns: int, fds: list[int]) -> Outcome:
    """Open ``path`` onto ``fds`` (the caller closes them), check its size, touch it if stale."""
    try:
        fds.append(os.open(path, os.O_RDONLY))
        st = os.fstat(fds[-1])
    except OSError as err:
        return Outcome(Step.OPEN_FAILED, err.errno or errno.EIO, 0)
    if st.st_size != stored:
        return Outcome(Step.WRONG_SIZE, st.st_size, 0)
    touch = 0
    if st.st_mtime_ns < stale_ns:  # a hit refreshes the LRU
        try:
            os.utime(fds[-1])
            touch = 1
        except OSError as err:
            touch = -(err.errno or errno.EIO)
    return Outcome(Step.OPENED, 0, touch)


def _read(fd: int, payload: Any, trailer: Any, stored: int, opened: Outcome) -> Outcome:
    try:
        got = os.readv(fd, [payload, trailer])
    except OSError as err:
        return Outcome(Step.READ_FAILED, err.errno or errno.EIO, opened.touch)
    return Outcome(Step.READ_OK if got == stored else Step.SHORT_READ, got, opened.touch)


def _read_page(paths: list[str], buffers: list[Any], stored: int, stale_ns: int) -> list[Outcome]:
    outcomes = [Outcome(Step.NOT_TRIED, 0, 0)] * len(paths)
    fds: list[int] = []
    try:
        for i, path in enumerate(paths):
            outcomes[i] = _open_sized(path, stored, stale_ns, fds)
            if outcomes[i].step != Step.OPENED:
                return outcomes
        for i, fd in enumerate(fds):
            outcomes[i] = _read(fd, buffers[2 * i], buffers[2 * i + 1], stored, outcomes[i])
            if outcomes[i].step != Step.READ_OK:
                return outcomes
        return outcomes
    finally:
        for fd in fds:
            os.close(fd)


def python_read_pages(
    paths: list[str], buffers: list[Any], stored: int, parts: int, stale_ns: int
) -> list[tuple[int, int, int]]:
    """``read_pages`` in Python (the module docstring): each system call holds the GIL."""
    _check(paths, buffers, stored, parts)
    out: list[tuple[int, int, int]] = []
    for first in range(0, len(paths), parts):
        page = slice(first, first + parts)
        objects = slice(2 * first, 2 * (first + parts))
        out += _read_page(paths[page], buffers[objects], stored, stale_ns)
    return out


try:  # built by `pip install` where a C compiler is present (setup.py: optional)
    from hicache.backends.cfile import read_pages as _c_read_pages
except ImportError:  # pragma: no cover - exercised on installs without a compiler
    _c_read_pages = None  # type: ignore[assignment]
NATIVE_READ = _c_read_pages is not None  # whether reads take the C path
read_pages: ReadPages = python_read_pages if _c_read_pages is None else _c_read_pages
