"""Command line and configuration grid of ``bench_transfer.py``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import psutil
import torch
from _common import ARENA_PINNING, MIB, parse_sizes
from _kv_buffers import Shape

DEFAULT_NW = 16 if torch.version.hip else 32
# item bytes -> tokens: 32 MiB per layer and side (16k slots of 2 KiB, as in the issue) + 2K/1k
DEFAULT_GRID = (
    (512, 65536),
    (1024, 32768),
    (2048, 16384),
    (2048, 1024),
    (4096, 8192),
    (16384, 2048),
)
FULL_ITEMS = (512, 1024, 2048, 4096, 8192, 16384)
FULL_TOKENS = (1024, 4096, 16384, 65536)
MEMORY_SHARE = 0.6  # of the available RAM the arenas may take
PRIORITY = (2048, 1024, 4096, 16384, 8192, 512)  # run order when the budget is tight


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of ``bench_transfer.py`` (``description``: its help title)."""
    ap = argparse.ArgumentParser(description=description)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="smoke run: tiny grid")
    mode.add_argument("--full", action="store_true", help="the whole grid (several minutes)")
    ap.add_argument("--device", default="auto", help="auto, cuda or cpu")
    ap.add_argument("--sections", default="sm,bidir,h2d,d2d", help="subset, run in this order")
    ap.add_argument("--items", type=parse_sizes, help="item bytes, e.g. 512,1K,2K,4K,16K")
    ap.add_argument("--page-sizes", type=_ints, help="e.g. 1,64")
    ap.add_argument("--tokens", type=parse_sizes, help="tokens per transfer, e.g. 1K,16K,64K")
    ap.add_argument("--layers", type=int, help="layers (default 32 on CUDA, 4 on CPU)")
    ap.add_argument("--pool-factor", type=int, default=2, help="pool slots per moved token")
    ap.add_argument(
        "--large-pool-factor",
        type=int,
        help="per-layer kernel loads again on pools this many times the transfer "
        "(0: off; default 8 on CUDA, 0 on CPU)",
    )
    ap.add_argument(
        "--order", choices=["sorted", "random"], default="sorted", help="pair issue order"
    )
    ap.add_argument(
        "--arena", choices=ARENA_PINNING, default="touch", help="host arena pinning (_common)"
    )
    ap.add_argument("--ops", help="only these op labels, e.g. per_layer,auto (layer_first)")
    ap.add_argument("--max-layer-mib", type=int, default=32, help="cap on tokens*item")
    ap.add_argument("--block-quota", type=_ints, default=[2], help="kernel block quotas")
    ap.add_argument("--num-warps", type=_ints, default=[DEFAULT_NW], help="warps per block")
    ap.add_argument("--d2d-block-quota", type=int, default=0, help="0: the GPU's SM count")
    ap.add_argument(
        "--bidir-items",
        type=parse_sizes,
        default=[2048, 16384],
        help="item sizes of the grid that also run load+backup at once",
    )
    ap.add_argument("--sets", type=int, default=4, help="index sets rotated through")
    ap.add_argument("--warmup", type=int, default=1, help="untimed calls (compiles)")
    ap.add_argument("--samples", type=int, default=5, help="timed samples; median")
    ap.add_argument("--min-sample-ms", type=float, default=2.0, help="calls batch up to this")
    ap.add_argument(
        "--direct-max-copies",
        type=int,
        default=16384,
        help="copies per direct call (page runs x tensors)",
    )
    ap.add_argument("--budget-s", type=float, help="wall budget (default 200; full 540)")
    ap.add_argument("--json", default="results/bench_transfer.json", help="output path")
    return ap.parse_args(argv)


def build_grid(args: argparse.Namespace, device: torch.device) -> list[Shape]:
    """The configurations, highest priority first."""
    cpu = device.type == "cpu"
    layers = args.layers or (4 if cpu else 32)
    if args.large_pool_factor is None:
        args.large_pool_factor = 0 if cpu else 8
    if args.quick:
        pairs = [(i, t) for i in ([512, 2048] if cpu else [2048]) for t in [256 if cpu else 4096]]
    elif args.full:
        pairs = [(i, t) for i in FULL_ITEMS for t in FULL_TOKENS]
    else:
        pairs = list(DEFAULT_GRID)
    if args.items:
        auto = [(i, max(1024, min(65536, 32 * MIB // i))) for i in args.items]
        pairs = [(i, t) for i, t in pairs if i in args.items] or auto
    if args.tokens:
        pairs = [(i, t) for i in dict.fromkeys(i for i, _ in pairs) for t in args.tokens]
    cap = args.max_layer_mib * MIB
    shapes = [
        Shape(i, ps, t, layers, args.pool_factor)
        for i, t in pairs
        if i * t <= cap
        for ps in args.page_sizes or [1, 64]
        if t >= ps
    ]
    rank = {item: r for r, item in enumerate(PRIORITY)}
    return sorted(shapes, key=lambda s: (rank.get(s.item, len(PRIORITY)), -s.tokens))


def host_bytes(shapes: list[Shape], device: torch.device, d2d: bool) -> int:
    """Host RAM the arenas of ``shapes`` take (``_kv_buffers.Arenas``): the host arena, and on
    the CPU the "device" arenas too."""
    if not shapes:
        return 0
    far, near = max(s.far_bytes for s in shapes), max(s.near_bytes for s in shapes)
    return far + (near + far * d2d if device.type == "cpu" else 0)


def fit_memory(shapes: list[Shape], need: Callable[[list[Shape]], int]) -> list[Shape]:
    """The longest highest-priority prefix of ``shapes`` whose arenas, ``need(prefix)`` bytes of
    RAM, fit in ``MEMORY_SHARE`` of the RAM available now; SystemExit when not even the first
    configuration does."""
    budget = int(psutil.virtual_memory().available * MEMORY_SHARE)
    kept = list(shapes)
    while kept and need(kept) > budget:
        kept.pop()
    if not kept:
        raise SystemExit(
            f"the first configuration needs {need(shapes[:1]) / 2**30:.1f} GiB of RAM, "
            f"{budget / 2**30:.1f} GiB usable: lower --layers, --tokens or --items"
        )
    return kept
