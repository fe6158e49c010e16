"""Benchmark the FP4 (E2M1) quantizer: quantize and dequantize GB/s against a copy of the bytes.

Run: ``python3 benchmarks/bench_fp4.py [--device auto|cuda|cpu] [--quick] [--json PATH]``.

Rows are KV layers of ``tokens x heads x head_dim`` values in ``--dtype`` (bfloat16 by default).
GB/s counts the full-precision bytes (``quantize``'s input, ``dequantize``'s output) over the
time of one call. ``copy_`` is a device-to-device ``dst.copy_(src)`` of those same bytes: it
reads and writes them all, while quantize reads them and, for 16-bit values, writes 9/32 as
many bytes (dequantize the reverse). Each ratio is the op's GB/s over the copy's. ``auto`` runs
what ``hicache.kernels.fp4`` picks (Triton on CUDA), ``reference`` the torch reference. On
CUDA, times are CUDA events (``_common.Clock``); sizes up to a few tens of MB may stay in L2,
for the copy and the ops alike.
``--quick`` is a CPU smoke run: two small sizes, few samples.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
from _common import GB, Clock, describe_device, format_table, import_hicache, pick_device

fp4 = import_hicache("kernels.fp4")
dispatch = import_hicache("kernels.dispatch")

FULL_TOKENS = [4096, 32768, 262144, 1048576]
QUICK_TOKENS = [256, 1024]


def _timed(clock: Clock, fn: Callable[[], object], backend: str | None) -> float:
    """Median seconds of one call of ``fn`` (under ``force_backend(backend)`` when given)."""

    def call(_: int) -> None:
        if backend is None:
            fn()
        else:
            with dispatch.force_backend(backend):
                fn()

    return clock.measure(call).median_s


def bench_size(clock: Clock, tokens: int, heads: int, dim: int, dtype: torch.dtype) -> dict:
    """GB/s of copy_, quantize and dequantize (auto and reference) of one layer's values."""
    x = torch.randn(tokens, heads, dim, device=clock.device).to(dtype)
    dst = torch.empty_like(x)
    packed, scales = fp4.quantize_fp4(x)
    nbytes = x.numel() * x.element_size()
    row = {"tokens": tokens, "bytes": nbytes}
    row["copy_"] = nbytes / _timed(clock, lambda: dst.copy_(x), None) / GB
    for backend in ("auto", "reference"):
        forced = None if backend == "auto" else backend
        q = _timed(clock, lambda: fp4.quantize_fp4(x), forced)
        d = _timed(clock, lambda: fp4.dequantize_fp4(packed, scales, dtype), forced)
        row[f"quantize {backend}"] = nbytes / q / GB
        row[f"dequantize {backend}"] = nbytes / d / GB
    return row


def table(rows: list[dict], title: str) -> str:
    ops = ["quantize auto", "dequantize auto", "quantize reference", "dequantize reference"]
    header = ["tokens", "MB", "copy_ GB/s", *(f"{op} GB/s (x copy)" for op in ops)]
    lines = [
        [
            str(r["tokens"]),
            f"{r['bytes'] / 1e6:.1f}",
            f"{r['copy_']:.3g}",
            *(f"{r[op]:.3g} ({r[op] / r['copy_']:.2g})" for op in ops),
        ]
        for r in rows
    ]
    return format_table(header, lines, title)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--quick", action="store_true", help="CPU smoke: small sizes")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--json", default=None, help="write rows and the device here")
    args = parser.parse_args()
    device = pick_device(args.device)
    dtype = getattr(torch, args.dtype)
    quick = args.quick or device.type == "cpu"
    clock = Clock(device, warmup=1 if quick else 3, samples=3 if quick else 15, min_sample_s=1e-3)
    sizes = QUICK_TOKENS if quick else FULL_TOKENS
    rows = [bench_size(clock, t, args.heads, args.head_dim, dtype) for t in sizes]
    title = f"FP4 quantizer on {device}, [tokens, {args.heads}, {args.head_dim}] {args.dtype}"
    print(table(rows, title))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": describe_device(device), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
