"""Cost of a storage object's trailer (``backends.page_sum``): making it at a write and checking
it at a read, per object, against a plain copy of the same bytes (LMCache reports xxh3 at 1.9x
the time of a copy; here the digest is xxh3-64 too).

Run: ``python benchmarks/bench_page_checksum.py [--sizes-kib 64 256 1024 4096]``. Objects are
random bytes (a 4 MiB object is one part of a Llama-3-8B page: 64 tokens x 32 layers x 8 KV
heads x 128 x bf16); the trailer carries a 32-layer page checksum. Prints a markdown table of
medians: us per object and GB/s for the check and for ``np.copyto``, and check / copy.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from hicache.backends.page_sum import check_trailer, make_trailer

LAYERS = 32


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm: page faults and caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(size: int, objects: int, repeats: int) -> dict[str, float]:
    """Median seconds per object of a check, a make and a copy, over ``objects`` objects."""
    rng = np.random.default_rng(size)
    payloads = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(objects)]
    out = np.empty(size, np.uint8)
    sums = np.arange(LAYERS, dtype=np.int64)
    trailers = [make_trailer(f"k{i}_k", p, sums) for i, p in enumerate(payloads)]
    named = list(enumerate(zip(payloads, trailers, strict=True)))
    for i, (p, t) in named:  # the check must pass, or the figure means nothing
        assert check_trailer(f"k{i}_k", p, t) is not None

    def check() -> None:
        for i, (p, t) in named:
            check_trailer(f"k{i}_k", p, t)

    def make() -> None:
        for i, p in enumerate(payloads):
            make_trailer(f"k{i}_k", p, sums)

    def copy() -> None:
        for p in payloads:
            np.copyto(out, p)

    return {
        name: _median_s(fn, repeats) / objects
        for name, fn in [("check", check), ("make", make), ("copy", copy)]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-kib", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--batch-mib", type=int, default=64, help="bytes hashed per timing")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    print("| object | check us | check GB/s | make us | copy us | copy GB/s | check / copy |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kib in args.sizes_kib:
        size = kib << 10
        t = measure(size, max(1, (args.batch_mib << 20) // size), args.repeats)
        print(
            f"| {kib} KiB | {t['check'] * 1e6:.1f} | {size / t['check'] / 1e9:.1f} | "
            f"{t['make'] * 1e6:.1f} | {t['copy'] * 1e6:.1f} | {size / t['copy'] / 1e9:.1f} | "
            f"{t['check'] / t['copy']:.2f} |"
        )


if __name__ == "__main__":
    main()
