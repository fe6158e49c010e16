"""Host pool memory: fault in and page-lock one large CPU buffer quickly, and say how long it took.

Page-locking a fresh buffer with one ``cudaHostRegister`` makes the driver fault in and zero
every page on one thread. :func:`pin_buffer` instead

1. asks for transparent huge pages (``madvise(MADV_HUGEPAGE)``; Linux, best effort): 512 times
   fewer faults, and a GPU whose translation can use 2 MiB pages misses its TLB less;
2. faults the pages in on several threads (each ``memset``s its own chunks, GIL released);
3. registers the buffer in chunks from those threads. A chunk boundary is a multiple of the
   caller's ``unit`` (the layout's largest run that one copy-engine copy may span), so no copy
   crosses two registrations.

It logs (``logging``, INFO) before it starts and when it ends, with the time and GB/s: creating a
host pool blocks the calling thread for that long. Without CUDA nothing is pinned or touched.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import torch

from hicache.devices import pin_tensor, unpin_tensor

logger = logging.getLogger(__name__)
T = TypeVar("T")

HUGE_PAGE = 2 << 20  # bytes: the x86-64 transparent huge page
CHUNK_BYTES = 1 << 30  # target registration chunk; rounded to the caller's unit
MAX_THREADS = 16
_MADV_HUGEPAGE = 14  # <sys/mman.h>, Linux


@dataclass(frozen=True)
class PinTimes:
    """What :func:`pin_buffer` did: bytes, chunks, threads, huge-page advice taken, seconds."""

    nbytes: int
    chunks: int
    threads: int
    huge_pages: bool
    touch_s: float
    register_s: float

    @property
    def seconds(self) -> float:
        return self.touch_s + self.register_s

    @property
    def gbps(self) -> float:
        """Pinned capacity per second (GB = 1e9 bytes)."""
        return self.nbytes / max(self.seconds, 1e-9) / 1e9


def chunk_bounds(nbytes: int, unit: int, target: int = CHUNK_BYTES) -> list[tuple[int, int]]:
    """``[start, end)`` byte ranges covering ``[0, nbytes)``: every inner boundary a multiple
    of ``unit``, each chunk about ``target`` bytes (at least one ``unit``); none when empty.

    ``ValueError`` unless ``nbytes >= 0`` and ``unit``, ``target`` are positive.
    """
    if nbytes < 0 or unit < 1 or target < 1:
        raise ValueError(f"need nbytes >= 0 and unit, target >= 1; got {nbytes}, {unit}, {target}")
    step = max(unit, target // unit * unit)
    return [(lo, min(lo + step, nbytes)) for lo in range(0, nbytes, step)]


def worker_count(chunks: int, limit: int | None = None) -> int:
    """Threads for ``chunks`` chunks: at most the CPUs this process may use and ``limit``
    (default :data:`MAX_THREADS`), at least one."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(chunks, cpus or 1, MAX_THREADS if limit is None else limit))


def advise_huge_pages(buffer: torch.Tensor) -> bool:
    """Ask Linux to back ``buffer``'s whole 2 MiB pages with huge pages (before first touch).

    Returns whether the advice was taken; False off Linux, for a buffer under 2 MiB, or when the
    kernel refuses (transparent huge pages off). Never raises.
    """
    nbytes = buffer.numel() * buffer.element_size()
    start = -(-buffer.data_ptr() // HUGE_PAGE) * HUGE_PAGE
    length = (buffer.data_ptr() + nbytes - start) // HUGE_PAGE * HUGE_PAGE
    if not sys.platform.startswith("linux") or length <= 0:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return int(libc.madvise(start, length, _MADV_HUGEPAGE)) == 0
    except (OSError, AttributeError):
        return False


def _parallel(
    fn: Callable[[torch.Tensor], T], parts: Sequence[torch.Tensor], threads: int
) -> list[T]:
    if threads == 1:
        return [fn(p) for p in parts]
    with ThreadPoolExecutor(threads, thread_name_prefix="hicache-pin") as pool:
        return list(pool.map(fn, parts))


def pin_buffer(
    buffer: torch.Tensor,
    unit: int,
    *,
    chunk_bytes: int | None = None,
    threads: int | None = None,
    touch: bool = True,
    huge_pages: bool = True,
) -> tuple[list[torch.Tensor], PinTimes]:
    """Page-lock a fresh contiguous CPU ``buffer`` in chunks (see the module); the chunks are
    byte views of it. Release them with :func:`unpin_chunks`.

    ``unit``: bytes no copy-engine copy may cross (chunk boundaries are its multiples);
    ``chunk_bytes``: the target chunk (default :data:`CHUNK_BYTES`).
    ``touch`` faults the pages in first by zeroing them (so ``buffer``'s content is lost), on
    ``threads`` threads (default :func:`worker_count`). Raises ``RuntimeError`` when CUDA
    refuses a registration (the chunks registered so far are released first).
    """
    nbytes = buffer.numel() * buffer.element_size()
    flat = buffer.view(-1).view(torch.uint8)
    bounds = chunk_bounds(nbytes, unit, CHUNK_BYTES if chunk_bytes is None else chunk_bytes)
    chunks = [flat[lo:hi] for lo, hi in bounds]
    workers = worker_count(len(chunks), threads)
    logger.info(
        "host memory: page-locking %.2f GB in %d chunks on %d threads (blocks this thread)",
        nbytes / 1e9,
        len(chunks),
        workers,
    )
    t0 = time.perf_counter()
    advised = huge_pages and advise_huge_pages(buffer)
    if touch:
        touch_pages(chunks, workers)
    t1 = time.perf_counter()
    registered = _parallel(_try_pin, chunks, workers)
    t2 = time.perf_counter()
    failed = [error for error in registered if isinstance(error, RuntimeError)]
    if failed:
        unpin_chunks([c for c, ok in zip(chunks, registered, strict=True) if ok is True])
        raise failed[0]
    times = PinTimes(nbytes, len(chunks), workers, advised, t1 - t0, t2 - t1)
    logger.info(
        "host memory: %.2f GB page-locked in %.2f s (%.1f GB/s; touch %.2f s, register %.2f s, "
        "huge pages %s)",
        nbytes / 1e9,
        times.seconds,
        times.gbps,
        times.touch_s,
        times.register_s,
        "advised" if advised else "not advised",
    )
    return chunks, times


def touch_pages(chunks: Sequence[torch.Tensor], threads: int) -> None:
    """Fault in (zero) every page of the contiguous uint8 ``chunks``, on ``threads`` threads
    (``ctypes.memset`` releases the GIL)."""
    _parallel(lambda c: ctypes.memset(c.data_ptr(), 0, c.numel()), chunks, threads)


def _try_pin(chunk: torch.Tensor) -> bool | RuntimeError:
    try:
        return pin_tensor(chunk)
    except RuntimeError as error:
        return error


def unpin_chunks(chunks: Sequence[torch.Tensor]) -> None:
    """Undo :func:`pin_buffer` for ``chunks`` (``cudaHostUnregister`` each)."""
    for chunk in chunks:
        unpin_tensor(chunk)
