"""ShmChannel: the agreement's minimum over ranks through shared memory, for ranks on one host.

A gloo all-reduce of a few words costs ~50 us to ~3 ms a call over loopback sockets (more the
busier the cores), which made SGLang's per-step HiCache agreement cost 0.6-3.2 ms; ranks on one
host can instead each write their words into a segment every rank maps and read the others'.

Layout: a header (its first word: a random token rank 0 stamps at creation), then one row of
``ROW`` int64 words per rank and parity (round ``r`` uses parity ``r & 1``):
``[round, length, word 0 .. word CAPACITY-1]``, rows on their own cache lines. A rank writes
its words, then the row's ``round``; it reads the others' words once every row of the round's
parity shows the round. Two parities are enough: a rank reaches round ``r + 2`` only after
every rank posted ``r + 1``, that is after every rank finished reading round ``r``. The order
"words, then round" is the writer's program order, which x86-64 keeps for every reader (stores
are not reordered with stores, loads not with loads), so the channel is used on x86-64 only.

Setup (``open``) runs two collectives of the process group at the group's first agreement:
rank 0 creates the segment under ``/dev/shm`` and every rank reports whether it mapped the
same one (same host, same ``/dev/shm``); rank 0 unlinks it once every rank has mapped it (or
failed to), so nothing is left behind even if a rank dies later. Waiting spins, then yields the
core, then sleeps in 50 us steps; it raises ``ChannelError`` past the deadline, or at once when
a peer's process has exited (checked every 10 ms where the ranks share a PID namespace).
"""

from __future__ import annotations

import mmap
import os
import platform
import secrets
import time
from array import array
from collections.abc import Callable

import torch

SHM_DIR = "/dev/shm"
CAPACITY = 62  # words a call may carry (longer vectors go through the process group)
ROW = 64  # int64 words a row: round, length, CAPACITY words (8 cache lines)
HEADER = 8  # int64 words before the rows: [token, unused...]
_ROUND, _LEN, _WORDS = 0, 1, 2
_SPIN_S, _YIELD_S, _SLEEP_S, _ALIVE_S = 20e-6, 1e-3, 50e-6, 10e-3

Collective = Callable[[torch.Tensor, str], list[int]]  # (words, "gather" | "min") -> result


class ChannelError(RuntimeError):
    """A round did not complete: a peer exited, or the deadline passed."""


def supported() -> bool:
    """Whether this machine can run the channel (x86-64 with a ``/dev/shm``)."""
    return platform.machine().lower() in ("x86_64", "amd64") and os.path.isdir(SHM_DIR)


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return -1


class ShmChannel:
    """The mapped segment of ``size`` ranks, seen by ``rank``; build it with :meth:`open`."""

    def __init__(self, segment: mmap.mmap, rank: int, size: int, pids: list[int] | None):
        self._segment = segment  # the mapping lives as long as the channel
        self._words = memoryview(segment).cast("q")
        self.rank, self.size = rank, size
        self._pids = pids  # peers' pids to watch, None where pids are not comparable
        self._round = 0

    @classmethod
    def open(cls, rank: int, size: int, collective: Collective) -> ShmChannel | None:
        """The channel of the group, or None where some rank cannot map it; every rank calls
        it at the same point. ``collective(tensor, kind)`` runs one collective of the group
        ("gather": every rank's int64 row, concatenated; "min": the element-wise minimum)."""
        token = secrets.randbits(62) if rank == 0 else 0
        path = os.path.join(SHM_DIR, f"hicache-tp-{os.getpid()}-{token:x}")
        segment = _create(path, size, token) if rank == 0 else None
        try:
            mine = [token, os.getpid(), _pid_namespace()]
            rows = collective(torch.tensor(mine, dtype=torch.int64), "gather")
            token = rows[0]
            peer_path = os.path.join(SHM_DIR, f"hicache-tp-{rows[1]}-{token:x}")
            if rank != 0:
                segment = _attach(peer_path, size)
            ok = int(segment is not None and _holds(segment, token))
            ok = collective(torch.tensor([ok], dtype=torch.int64), "min")[0]
        finally:
            if rank == 0:
                _unlink(path)
        if not ok or segment is None:
            if segment is not None:
                segment.close()
            return None
        pids = rows[1::3]
        same_ns = len(set(rows[2::3])) == 1 and rows[2] != -1
        return cls(segment, rank, size, pids if same_ns else None)

    def all_reduce_min(self, words: list[int], deadline: float) -> list[int]:
        """Element-wise minimum of every rank's ``words`` (at most ``CAPACITY``; every rank the
        same length). ``ChannelError`` when a peer exited, the deadline passed or the ranks
        passed vectors of different lengths."""
        self._round += 1
        r, n, mem = self._round, len(words), self._words
        mine = self._row(self.rank, r)
        mem[mine + _WORDS : mine + _WORDS + n] = array("q", words)
        mem[mine + _LEN] = n
        mem[mine + _ROUND] = r  # last: publishes the words
        rows = [self._row(peer, r) for peer in range(self.size) if peer != self.rank]
        self._wait(rows, r, deadline)
        result = list(words)
        for row in rows:
            if mem[row + _LEN] != n:
                raise ChannelError(f"ranks passed {n} and {mem[row + _LEN]} words to one round")
            result = list(map(min, result, mem[row + _WORDS : row + _WORDS + n].tolist()))
        return result

    def _row(self, rank: int, r: int) -> int:
        return HEADER + (rank * 2 + (r & 1)) * ROW

    def _wait(self, rows: list[int], r: int, deadline: float) -> None:
        mem, pending = self._words, list(rows)
        start = time.monotonic()
        checked = start
        while pending:
            pending = [row for row in pending if mem[row + _ROUND] < r]
            if not pending:
                return
            now = time.monotonic()
            if now - start < _SPIN_S:
                continue
            if now > deadline:
                raise ChannelError("a peer did not reach the round before the timeout")
            if now - checked > _ALIVE_S:
                checked = now
                self._check_alive()
            if now - start < _YIELD_S:
                os.sched_yield()
            else:
                time.sleep(_SLEEP_S)

    def _check_alive(self) -> None:
        for peer, pid in enumerate(self._pids or ()):
            if peer != self.rank and not _alive(pid):
                raise ChannelError(f"rank {peer} (pid {pid}) exited")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie (a rank that exited stays
    one until its launcher reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[-1].split()[:1]
    except FileNotFoundError:
        return False
    except OSError:  # no procfs: whether it exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return state not in ([b"Z"], [b"X"])


def _nbytes(size: int) -> int:
    return (HEADER + size * 2 * ROW) * 8


def _create(path: str, size: int, token: int) -> mmap.mmap | None:
    """A new segment at ``path`` with ``token`` in its header (None where it cannot be made)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return None
    try:
        os.ftruncate(fd, _nbytes(size))
        segment = mmap.mmap(fd, _nbytes(size))
    except OSError:
        return None
    finally:
        os.close(fd)
    segment[:8] = token.to_bytes(8, "little")
    return segment


def _attach(path: str, size: int) -> mmap.mmap | None:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size != _nbytes(size):
            return None
        return mmap.mmap(fd, _nbytes(size))
    except OSError:
        return None
    finally:
        os.close(fd)


def _holds(segment: mmap.mmap, token: int) -> bool:
    """Whether ``segment`` is the one rank 0 made: its header holds ``token`` (a stale file of
    the same name would not)."""
    return int.from_bytes(segment[:8], "little") == token


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


__all__ = ["CAPACITY", "ChannelError", "Collective", "ShmChannel", "supported"]
