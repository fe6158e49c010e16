"""Benchmark building RadixKeys: list conversion, and a long prompt prefilled chunk by chunk.

Run: ``python3 benchmarks/bench_keys.py [--quick]``. Medians of thread CPU time over repeats
(interleaved, so host noise hits every variant alike).

conversion : one Python list of token ids to an int32 array, 2k and 128k ids. ``to_token_array``
    (validates: ints only, no bools, in ``[0, 2**31)``) through the C pass
    (``hicache.radix.cpack``) and through its pure-Python fallback (``native=False``: ``struct``
    plus checks on the array), against plain conversions that validate less or nothing:
    ``array.array``, ``np.fromiter`` and ``np.array`` (both take floats and strings), and a
    list copy (touches every item, converts nothing: what slicing a list key costs).
chunked prefill : the keys a request hands ``cache_unfinished_req`` while a prompt is prefilled
    in 4k-token chunks, then the finished key: rebuilt from the lists on every chunk (as
    ``kv_key`` does from ``origin_input_ids``: quadratic in the prompt length) against a
    ``TokenBuffer`` filled once at submit whose keys are views (linear).
"""

from __future__ import annotations

import argparse
import array
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hicache.radix import RadixKey, tokens  # noqa: E402
from hicache.radix.tokens import TokenBuffer, to_token_array  # noqa: E402

VOCAB = 128_000
CHUNK = 4096


CONVERSIONS: dict[str, Callable[[list[int]], object]] = {
    "to_token_array (C pass)": to_token_array,
    "to_token_array native=False": lambda ids: to_token_array(ids, native=False),
    "array.array('i') (no bool check)": lambda ids: array.array("i", ids),
    "np.fromiter int32 (no checks)": lambda ids: np.fromiter(ids, np.int32, len(ids)),
    "np.array int32 (no checks)": lambda ids: np.array(ids, dtype=np.int32),
    "list copy ids[:] (no conversion)": lambda ids: ids[:],
}


def _medians(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median thread CPU ns of each function, run in turn ``repeats`` times (one warm-up)."""
    times: dict[str, list[int]] = {name: [] for name in fns}
    for i in range(repeats + 1):
        for name, fn in fns.items():
            start = time.thread_time_ns()
            fn()
            if i:
                times[name].append(time.thread_time_ns() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench_conversion(n: int, repeats: int) -> dict[str, float]:
    """ns per token of each conversion of an ``n``-token list."""
    ids = np.random.default_rng(n).integers(0, VOCAB, n).tolist()
    fns = {name: (lambda f=f: f(ids)) for name, f in CONVERSIONS.items()}
    return {name: ns / n for name, ns in _medians(fns, repeats).items()}


def prefill_from_lists(prompt: list[int]) -> None:
    """Keys of every chunk end, each rebuilt from the prompt list (``kv_key`` today)."""
    for end in range(CHUNK, len(prompt) + CHUNK, CHUNK):
        RadixKey(prompt[: min(end, len(prompt))])


def prefill_from_buffer(prompt: list[int]) -> None:
    """The prompt converted once into a TokenBuffer; every chunk's key is a view."""
    buf = TokenBuffer(prompt, capacity=len(prompt) + 1)
    for end in range(CHUNK, len(prompt) + CHUNK, CHUNK):
        RadixKey.from_validated(buf.ids(min(end, len(prompt))), None)


def bench_prefill(n: int, repeats: int) -> dict[str, float]:
    """ms to build all the keys of an ``n``-token prompt prefilled in CHUNK-token chunks."""
    prompt = np.random.default_rng(7).integers(0, VOCAB, n).tolist()
    fns = {
        "rebuilt from lists": lambda: prefill_from_lists(prompt),
        "TokenBuffer views": lambda: prefill_from_buffer(prompt),
    }
    return {name: ns / 1e6 for name, ns in _medians(fns, repeats).items()}


def bench_decode(tokens: int, repeats: int) -> float:
    """ns per generated token appended to a TokenBuffer (one ``append`` each)."""
    buf = TokenBuffer(list(range(1024)), capacity=1024 + tokens * (repeats + 1))

    def run() -> None:
        for t in range(tokens):
            buf.append(t)

    return _medians({"append": run}, repeats)["append"] / tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    reps = 5 if parser.parse_args().quick else 25
    native = "built" if tokens.NATIVE_PACK else "NOT built: both rows take struct"
    print(f"List to int32 array, ns per token (median thread CPU time; cpack {native}):")
    sizes = (2048, 131_072)
    conv = {n: bench_conversion(n, reps if n > 10_000 else reps * 8) for n in sizes}
    print(f"  {'':34}" + "".join(f"{f'{n:,} ids':>14}" for n in sizes))
    for name in CONVERSIONS:
        print(f"  {name:34}" + "".join(f"{conv[n][name]:>14.1f}" for n in sizes))
    print(f"\nKeys of a prompt prefilled in {CHUNK}-token chunks, total ms:")
    lengths = (32_768, 65_536, 131_072)
    pre = {n: bench_prefill(n, max(3, reps // 3)) for n in lengths}
    print(f"  {'':32}" + "".join(f"{f'{n // 1024}k prompt':>14}" for n in lengths))
    for name in pre[lengths[0]]:
        print(f"  {name:32}" + "".join(f"{pre[n][name]:>14.2f}" for n in lengths))
    print(f"\nTokenBuffer.append per generated token: {bench_decode(1024, reps):.0f} ns")


if __name__ == "__main__":
    main()
