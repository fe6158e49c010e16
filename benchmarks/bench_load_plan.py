"""CPU time per load batch: 32 per-layer calls against one plan run layer by layer.

A batch loads ``--tokens`` scattered host slots into scattered device slots, every layer, through
the host pool: ``per-layer`` calls ``load_to_device_per_layer`` once per layer (each call checks
the indices, moves them, picks the route and plans the op again); ``plan-once`` calls
``plan_load`` once and ``LoadPlan.run`` per layer (what ``HiCacheController.start_loading``
does). Reported: median thread CPU time per batch in microseconds (what the scheduler thread
pays; on CUDA the copies run asynchronously and are synchronized outside the timed region), and
the saving. Every (layout, io_backend) route of the MHA host pool, page sizes from ``--pages``.

Run: ``PYTHONPATH=. python benchmarks/bench_load_plan.py --device cuda`` (``--device cpu`` runs
the torch reference copies, so the copy itself dominates there).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from hicache.pools import SUPPORTED_PAIRS, MHATokenToKVPool, MHATokenToKVPoolHost

LAYERS, HEADS, DIM = 32, 8, 128


def _pools(
    layout: str, page: int, tokens: int, device: str
) -> tuple[MHATokenToKVPool, MHATokenToKVPoolHost]:
    size = 2 * tokens
    dev = MHATokenToKVPool(size, page, torch.bfloat16, HEADS, DIM, LAYERS, device)
    return dev, MHATokenToKVPoolHost(dev, 2.0, 0, page, layout)


def _slots(pages: int, count: int, page: int, first: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(pages, generator=gen)[:count] + first
    return (chosen[:, None] * page + torch.arange(page)).flatten()


def _cpu_us(fn: Callable[[], None], repeats: int, sync: Callable[[], None]) -> float:
    samples = []
    for _ in range(repeats):
        sync()
        start = time.thread_time_ns()
        fn()
        samples.append((time.thread_time_ns() - start) / 1e3)
        sync()
    return statistics.median(samples)


def _row(layout: str, backend: str, page: int, args: argparse.Namespace) -> list[str]:
    dev, host = _pools(layout, page, args.tokens, args.device)
    count = args.tokens // page
    h = _slots(host.size // page, count, page, 0, seed=1)
    d = _slots(dev.size // page, count, page, 1, seed=2)
    if backend == "kernel":
        h, d = h.to(args.device), d.to(args.device)

    def per_layer() -> None:
        for layer in range(LAYERS):
            host.load_to_device_per_layer(dev, h, d, layer, backend)

    def plan_once() -> None:
        plan = host.plan_load(dev, h, d, backend)
        for layer in range(LAYERS):
            plan.run(layer)

    sync = torch.cuda.synchronize if args.device == "cuda" else lambda: None
    per_layer(), plan_once()  # warm up: compile kernels, load the runtime
    a = _cpu_us(per_layer, args.repeats, sync)
    b = _cpu_us(plan_once, args.repeats, sync)
    return [layout, backend, str(page), f"{a:,.0f}", f"{b:,.0f}", f"{1 - b / a:.0%}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per load batch")
    parser.add_argument("--pages", default="1,64", help="page sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    header = ["layout", "io_backend", "page", "per-layer us", "plan-once us", "saved"]
    rows = [
        _row(layout, backend, page, args)
        for page in (int(p) for p in args.pages.split(","))
        for backend, layouts in SUPPORTED_PAIRS.items()
        for layout in layouts
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(f"{LAYERS}-layer load batch of {args.tokens} tokens on {args.device}: CPU time per batch")
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
