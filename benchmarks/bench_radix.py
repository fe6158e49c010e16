"""Benchmark RadixCache on the CPU at page sizes 1, 16 and 64 and compare with SGLang 0.5.9.

Run: ``python3 benchmarks/bench_radix.py [--quick] [--wall]``. The tree runs as a pure index (no
pools; values are slot tensors the benchmark passes in, or the token ids), so the figures are the
tree's own cost; an allocator's ``free`` comes on top of ``evict``. Every row with a key runs
twice: ``array`` keys are RadixKeys built before timing (as a request's key viewing its
``TokenBuffer`` is), ``list`` keys are Python lists that each timed ``match_prefix`` / ``insert``
turns into a RadixKey itself (what a scheduler passing ``fill_ids`` pays). Every figure is the
median over repeats after one untimed warm-up run, in thread CPU time (robust to other load on a
shared 2-core host; ``--wall`` for wall time). Key building on its own (list conversion against
numpy baselines, a long prompt prefilled in chunks) is measured by ``bench_keys.py``.

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
ROWS = [  # metric, label, unit, lower is better, keyed (runs with array and with list keys)
    ("match_one", "match 128k, 1 node", "ms", True, True),
    ("match_chain", "match 128k, 64-node chain", "ms", True, True),
    ("insert", "insert 2k (1k shared)", "us/op", True, True),
    ("evict", "evict 1,000 pages @1M", "ms", True, False),
    ("mixed", "mixed 20k ops", "ops/s", False, True),
]
KEY_KINDS = ("array", "list")
Key = RadixKey | list[int]


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


def _as(kind: str, ids: np.ndarray) -> Key:
    """``ids`` as the benchmark hands it to the tree: a prebuilt RadixKey or a Python list."""
    return RadixKey(ids) if kind == "array" else ids.tolist()


def bench_match(page: int, repeats: int, kind: str) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    key = RadixKey(rng.integers(0, VOCAB, 131_072))
    one = RadixCache(None, None, page)
    one.insert(key)
    chain = RadixCache(None, None, page)
    for end in range(2048, 131_072 + 1, 2048):
        chain.insert(key[:end])
    assert len(_path(chain, key)) == 64, "the chain benchmark needs a 64-node path"
    query = _as(kind, key.token_ids)
    return (
        _median_ms(lambda: one.match_prefix(query), repeats),
        _median_ms(lambda: chain.match_prefix(query), repeats),
    )


def _path(cache: RadixCache, key: RadixKey) -> list:
    node, path = cache.match_prefix(key).last_device_node, []
    while node is not cache.root:
        path.append(node)
        node = node.parent
    return path


def _shared_prefix_keys(
    rng: np.random.Generator, groups: int, per_group: int, kind: str = "array"
) -> list[Key]:
    keys = []
    for _ in range(groups):
        prefix = rng.integers(0, VOCAB, 1024)
        keys += [
            _as(kind, np.concatenate([prefix, rng.integers(0, VOCAB, 1024)]))
            for _ in range(per_group)
        ]
    return keys


def bench_insert(page: int, repeats: int, kind: str, count: int = 2000) -> float:
    keys = _shared_prefix_keys(np.random.default_rng(1), 1, count, kind)
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


def _mixed_requests(rng: np.random.Generator, count: int, kind: str) -> list[tuple[Key, Key]]:
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
        requests.append((_as(kind, prompt), _as(kind, full)))
    return requests


def bench_mixed(
    page: int, repeats: int, kind: str, ops: int = 20_000, capacity: int = 262_144
) -> float:
    requests = _mixed_requests(np.random.default_rng(3), ops // 4, kind)
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


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def run_all(reps: int) -> dict[str, list[float]]:
    """``{metric/kind (or metric, for evict): [value at each page size]}``."""
    results: dict[str, list[float]] = {}

    def put(name: str, value: float) -> None:
        results.setdefault(name, []).append(value)

    for page in PAGE_SIZES:
        for kind in KEY_KINDS:
            one, chain = bench_match(page, reps * 2, kind)
            put(f"match_one/{kind}", one)
            put(f"match_chain/{kind}", chain)
            put(f"insert/{kind}", bench_insert(page, max(2, reps // 5), kind))
            put(f"mixed/{kind}", bench_mixed(page, max(2, reps // 5), kind))
        put("evict", bench_evict(page, reps))
    return results


def print_table(results: dict[str, list[float]]) -> None:
    pages = "".join(f"{'page ' + str(p):>11}" for p in PAGE_SIZES)
    print(f"{'metric':28}{'keys':>7}{'unit':>7}{pages}{'SGLang p1/p16':>17}{'speedup p1/p16':>17}")
    for metric, label, unit, lower, keyed in ROWS:
        for kind in KEY_KINDS if keyed else ("-",):
            ours = results[f"{metric}/{kind}" if keyed else metric]
            base = SGLANG[metric]
            gain = [b / o if lower else o / b for o, b in zip(ours, base, strict=False)]
            cells = "".join(f"{_fmt(v):>11}" for v in ours)
            print(
                f"{label:28}{kind:>7}{unit:>7}{cells}{_fmt(base[0]) + ' / ' + _fmt(base[1]):>17}"
                f"{f'{gain[0]:.0f}x / {gain[1]:.0f}x':>17}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--wall", action="store_true", help="wall-clock instead of CPU time")
    args = parser.parse_args()
    if args.wall:
        CLOCK["clock"] = time.perf_counter_ns
    results = run_all(5 if args.quick else 20)
    clock = "wall time" if args.wall else "thread CPU time"
    print(f"RadixCache, pure index, {torch.get_num_threads()} torch threads; median {clock}\n")
    print_table(results)


if __name__ == "__main__":
    main()
