"""Cost of the wrong-thread guard (``hicache.threads``): ns per guarded call.

Run: ``python3 benchmarks/bench_thread_guard.py`` (it turns ``HICACHE_CHECK_THREADS`` on). Times
a method that returns at once, plain and guarded (``ThreadBound``), and two real guarded calls
with the guard and without (the undecorated function called directly): ``PageAllocator.free`` of
an empty tensor and ``RadixCache.match_prefix`` of a 64-token key in a small tree. Medians of 9
repeats in thread CPU time (robust to other load on a shared host), nanoseconds per call.
"""

from __future__ import annotations

import os
import statistics
import time
import timeit
from collections.abc import Callable

os.environ["HICACHE_CHECK_THREADS"] = "1"  # read when the guarded classes are defined

import torch  # noqa: E402

from hicache.pools.allocator import PageAllocator  # noqa: E402
from hicache.radix import RadixCache, RadixKey  # noqa: E402
from hicache.threads import ThreadBound  # noqa: E402

CALLS = 200_000


class Plain:
    def touch(self) -> None:
        return None


class Guarded(ThreadBound):
    thread_guarded = "touch"

    def touch(self) -> None:
        return None


def ns_per_call(fn: Callable[[], object], calls: int = CALLS) -> float:
    timer = timeit.Timer(fn, timer=time.thread_time)
    return statistics.median(timer.repeat(number=calls, repeat=9)) / calls * 1e9


def rows() -> list[tuple[str, float, float]]:
    """(what, ns plain, ns guarded) per row."""
    plain, guarded = Plain(), Guarded()
    out = [("empty method", ns_per_call(plain.touch), ns_per_call(guarded.touch))]
    alloc, nothing = PageAllocator(64, 1), torch.empty(0, dtype=torch.int64)
    free_raw = PageAllocator.free.__wrapped__  # type: ignore[attr-defined]
    out.append(
        (
            "PageAllocator.free(empty)",
            ns_per_call(lambda: free_raw(alloc, nothing), CALLS // 10),
            ns_per_call(lambda: alloc.free(nothing), CALLS // 10),
        )
    )
    cache = RadixCache(None, None, page_size=16)
    key = RadixKey(list(range(64)))
    cache.insert(key)
    match_raw = RadixCache.match_prefix.__wrapped__  # type: ignore[attr-defined]
    out.append(
        (
            "RadixCache.match_prefix(64 tokens)",
            ns_per_call(lambda: match_raw(cache, key), CALLS // 20),
            ns_per_call(lambda: cache.match_prefix(key), CALLS // 20),
        )
    )
    return out


def main() -> None:
    print(f"{'call':<36} {'plain ns':>9} {'guarded ns':>11} {'guard ns':>9}")
    for what, raw, guarded in rows():
        print(f"{what:<36} {raw:>9.0f} {guarded:>11.0f} {guarded - raw:>9.0f}")


if __name__ == "__main__":
    main()
