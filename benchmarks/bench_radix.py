"""Benchmark RadixCache on the CPU at page sizes 1, 16 and 64 and compare with SGLang 0.5.9.

Run: ``python3 benchmarks/bench_radix.py [--quick] [--wall]``. The tree runs as a pure index (no
pools; values are slot tensors the benchmark passes in, or the token ids), so the figures are the
tree's own cost; an allocator's ``free`` comes on top of ``evict``. Keys are built as RadixKeys
before timing, as a server builds one per request; the cost of building one from a Python list
is printed separately. Every figure is the median over repeats after one untimed warm-up run,
in thread CPU time (robust to other load on a shared 2-core host; ``--wall`` for wall time).

Workloads
---------
match 128k, 1 node : one cached 131,072-token sequence, match the whole of it.
match 128k, chain  : the same key cached as a chain of 64 nodes (2,048 tokens each).
insert             : 2,000 sequences of 2,048 tokens sharing a 1,024-token prefix, with values.
evict 1,000 pages  : 1M cached tokens (60 groups of 16 sequences of 2,048 tokens sharing 1,024);
                     one ``evict(1000 * page_size)``; the tree is refilled between repeats.
mixed              : serving-like requests (32 system prompts, multi-turn chains): per request
                     match, lock, insert prompt+output, unlock, and evict down to a 256k-token
                     capacity when above it; 20,000 operations counted one by one.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hicache.radix import RadixCache, RadixKey  # noqa: E402

PAGE_SIZES = (1, 16, 64)
VOCAB = 32_000
# SGLang 0.5.9 RadixCache on the same 2-core machine: {metric: (page 1, page 16)}.
SGLANG = {
    "match_one": (10.8, 6.0),
    "match_chain": (26.6, 22.3),
    "insert": (111.0, 52.0),
    "evict": (2.8, 2.5),
    "mixed": (12_000.0, 18_000.0),
}
ROWS = [  # metric, label, unit, lower is better
    ("match_one", "match 128k, 1 node", "ms", True),
    ("match_chain", "match 128k, 64-node chain", "ms", True),
    ("insert", "insert 2k (1k shared)", "us/op", True),
    ("evict", "evict 1,000 pages @1M", "ms", True),
    ("mixed", "mixed 20k ops", "ops/s", False),
]


CLOCK = {"clock": time.thread_time_ns}


def _median_ms(
    fn: Callable[[], object], repeats: int, setup: Callable[[], object] | None = None
) -> float:
    """Median of ``repeats`` timed calls of ``fn`` after one untimed warm-up call."""
    clock, times = CLOCK["clock"], []
    for _ in range(repeats + 1):
        if setup is not None:
            setup()
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times[1:]) / 1e6


def bench_match(page: int, repeats: int) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    key = RadixKey(rng.integers(0, VOCAB, 131_072))
    one = RadixCache(None, None, page)
    one.insert(key)
    chain = RadixCache(None, None, page)
    for end in range(2048, 131_072 + 1, 2048):
        chain.insert(key[:end])
    assert len(_path(chain, key)) == 64, "the chain benchmark needs a 64-node path"
    return (
        _median_ms(lambda: one.match_prefix(key), repeats),
        _median_ms(lambda: chain.match_prefix(key), repeats),
    )


def _path(cache: RadixCache, key: RadixKey) -> list:
    node, path = cache.match_prefix(key).last_device_node, []
    while node is not cache.root:
        path.append(node)
        node = node.parent
    return path


def _shared_prefix_keys(rng: np.random.Generator, groups: int, per_group: int) -> list[RadixKey]:
    keys = []
    for _ in range(groups):
        prefix = rng.integers(0, VOCAB, 1024)
        keys += [
            RadixKey(np.concatenate([prefix, rng.integers(0, VOCAB, 1024)]))
            for _ in range(per_group)
        ]
    return keys


def bench_insert(page: int, repeats: int, count: int = 2000) -> float:
    keys = _shared_prefix_keys(np.random.default_rng(1), 1, count)
    values = [torch.arange(i * 2048, (i + 1) * 2048, dtype=torch.int64) for i in range(count)]
    caches: list[RadixCache] = []

    def run() -> None:
        cache = caches[-1]
        for key, value in zip(keys, values, strict=True):
            cache.insert(key, value)

    def fresh() -> None:
        caches.clear()
        gc.collect()  # free the previous tree (parent/child cycles) before timing the next
        caches.append(RadixCache(None, None, page))

    return _median_ms(run, repeats, setup=fresh) * 1e3 / count


def bench_evict(page: int, repeats: int) -> float:
    keys = _shared_prefix_keys(np.random.default_rng(2), 60, 16)
    cache = RadixCache(None, None, page)

    def refill() -> None:
        for key in keys:
            cache.insert(key)

    refill()
    assert cache.total_size() >= 1_000_000, cache.total_size()
    return _median_ms(lambda: cache.evict(1000 * page), repeats, setup=refill)


def _mixed_requests(rng: np.random.Generator, count: int) -> list[tuple[RadixKey, RadixKey]]:
    systems = [rng.integers(0, VOCAB, 1024) for _ in range(32)]
    history: list[np.ndarray] = []
    requests = []
    for _ in range(count):
        if history and rng.random() < 0.5:  # next turn of an earlier conversation
            base = history[int(rng.integers(len(history)))]
        else:
            base = systems[int(rng.integers(len(systems)))]
        prompt = np.concatenate([base, rng.integers(0, VOCAB, int(rng.integers(64, 512)))])
        full = np.concatenate([prompt, rng.integers(0, VOCAB, int(rng.integers(32, 256)))])
        history = (history + [full])[-256:]
        requests.append((RadixKey(prompt), RadixKey(full)))
    return requests


def bench_mixed(page: int, repeats: int, ops: int = 20_000, capacity: int = 262_144) -> float:
    requests = _mixed_requests(np.random.default_rng(3), ops // 4)
    caches: list[RadixCache] = []

    def fresh() -> None:
        caches.clear()
        gc.collect()
        caches.append(RadixCache(None, None, page))

    def run() -> None:
        cache, done = caches[-1], 0
        for prompt, full in requests:
            node = cache.match_prefix(prompt).last_device_node
            cache.inc_lock_ref(node)
            cache.insert(full)
            cache.dec_lock_ref(node)
            done += 4
            if cache.total_size() > capacity:
                cache.evict(cache.total_size() - capacity)
                done += 1
            if done >= ops:
                return

    return ops / (_median_ms(run, repeats, setup=fresh) / 1e3)


def bench_key_build() -> tuple[float, float]:
    small = np.random.default_rng(4).integers(0, VOCAB, 2048).tolist()
    large = np.random.default_rng(5).integers(0, VOCAB, 131_072).tolist()
    return (_median_ms(lambda: RadixKey(small), 50) * 1e3, _median_ms(lambda: RadixKey(large), 10))


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--wall", action="store_true", help="wall-clock instead of CPU time")
    args = parser.parse_args()
    reps = 5 if args.quick else 20
    if args.wall:
        CLOCK["clock"] = time.perf_counter_ns
    results: dict[str, list[float]] = {metric: [] for metric, *_ in ROWS}
    for page in PAGE_SIZES:
        one, chain = bench_match(page, reps * 2)
        results["match_one"].append(one)
        results["match_chain"].append(chain)
        results["insert"].append(bench_insert(page, max(2, reps // 5)))
        results["evict"].append(bench_evict(page, reps))
        results["mixed"].append(bench_mixed(page, max(2, reps // 5)))
    clock = "wall time" if args.wall else "thread CPU time"
    print(f"RadixCache, pure index, {torch.get_num_threads()} torch threads; median {clock}\n")
    head = f"{'metric':28}{'unit':>7}" + "".join(f"{'page ' + str(p):>11}" for p in PAGE_SIZES)
    print(head + f"{'SGLang p1/p16':>17}{'speedup p1/p16':>17}")
    for metric, label, unit, lower in ROWS:
        ours = results[metric]
        base = SGLANG[metric]
        gain = [b / o if lower else o / b for o, b in zip(ours, base, strict=False)]
        cells = "".join(f"{_fmt(v):>11}" for v in ours)
        print(
            f"{label:28}{unit:>7}{cells}{_fmt(base[0]) + ' / ' + _fmt(base[1]):>17}"
            f"{f'{gain[0]:.0f}x / {gain[1]:.0f}x':>17}"
        )
    small_us, large_ms = bench_key_build()
    print(
        f"\nRadixKey from a Python list (once per request): 2k tokens {small_us:.1f} us, "
        f"128k tokens {large_ms:.2f} ms"
    )


if __name__ == "__main__":
    main()
