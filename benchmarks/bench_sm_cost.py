"""What a transfer costs the model: a compute-bound bf16 matmul loop alone vs with a transfer.

The transfer (per-layer loads, or all-layer backups, of scattered 2 KiB slots) runs on its own
stream with a small ``block_quota``; both streams are released together after a sleep gate, the
matmul loop is timed with events on the compute stream, and each finished transfer records an
event, so the transfer's bandwidth *while overlapped* is reported next to its bandwidth alone.

    python3 benchmarks/bench_sm_cost.py [--block-quota 2,4] [--json results/bench_sm_cost.json]

CUDA only; on CPU it reports nothing. ``bench_transfer.py`` runs it as one of its sections.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from _common import Clock, import_hicache, log, pick_device
from _kv_buffers import Arenas, Pools, Shape
from _report import SLOWDOWN_TARGET_PCT, render_sm_cost
from _transfer_cases import bind, spec

TRANSFERS = {"load per_layer": spec("per_layer", "load"),
             "backup all_layer": spec("all_layer", "backup")}


def _matmul_loop(clock: Clock, n: int, loop_s: float) -> tuple[Callable[[], None], float]:
    """A loop of ``[n, n] @ [n, n]`` bf16 matmuls lasting about ``loop_s``; and its CPU cost."""
    a, b = (torch.randn(n, n, device=clock.device, dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty_like(a)
    one = clock.measure(lambda k: torch.mm(a, b, out=c))
    iters = max(1, math.ceil(loop_s / one.median_s))

    def loop() -> None:
        for _ in range(iters):
            torch.mm(a, b, out=c)

    return loop, iters * one.cpu_s


def _overlap_once(clock: Clock, loop: Callable[[], None], xfer: Callable[[int], None],
                  n_xfer: int, stream: torch.cuda.Stream, gate_s: float):
    """Seconds of the matmul loop, its end and each transfer's end (both since the release)."""
    clock.gate(gate_s)
    go, start, end = clock.event(), clock.event(), clock.event()
    go.record()
    stream.wait_event(go)
    done = []
    with torch.cuda.stream(stream):
        for i in range(n_xfer):
            xfer(i)
            done.append(clock.event())
            done[-1].record()
    start.record()
    loop()
    end.record()
    clock.sync()
    return start.elapsed_time(end) / 1e3, go.elapsed_time(end) / 1e3, [
        go.elapsed_time(e) / 1e3 for e in done]


def _overlap_gbps(mm_end_s: float, finished_s: list[float], nbytes: int) -> float:
    n = sum(t <= mm_end_s for t in finished_s)
    return n * nbytes / finished_s[n - 1] / 1e9 if n else 0.0


def sm_cost(clock: Clock, kernels: ModuleType, pools: Pools, knobs_list: list[dict], *,
            mm_n: int = 8192, loop_s: float = 0.05, reps: int = 5) -> list[dict]:
    """Matmul slowdown (%) per transfer kind and knob setting; [] on CPU."""
    if not clock.cuda:
        log("sm-cost: skipped (needs CUDA)")
        return []
    loop, loop_cpu_s = _matmul_loop(clock, mm_n, loop_s)
    stream = torch.cuda.Stream(device=clock.device)
    out = []
    for knobs in knobs_list:
        for name, sp in TRANSFERS.items():
            xfer = bind(kernels, sp, pools, pools.shape.tokens, knobs)
            alone = clock.measure(xfer)
            nbytes = sp.bytes_moved(pools.shape, pools.shape.tokens)
            n_xfer = min(400, math.ceil(1.3 * loop_s / alone.median_s) + 1)
            gate_s = 1.5 * (n_xfer * alone.cpu_s + loop_cpu_s) + 2e-3
            runs = [_overlap_once(clock, loop, xfer, n, stream, gate_s)
                    for _ in range(reps) for n in (0, n_xfer)]
            mm_alone = statistics.median(r[0] for r in runs[0::2])
            mm_with = statistics.median(r[0] for r in runs[1::2])
            slowdown = 100.0 * (mm_with / mm_alone - 1.0)
            overlap = statistics.median(_overlap_gbps(r[1], r[2], nbytes) for r in runs[1::2])
            target = {"threshold": SLOWDOWN_TARGET_PCT, "passed": slowdown <= SLOWDOWN_TARGET_PCT}
            out.append({
                "transfer": name, "op": sp.op, **knobs, "mm_n": mm_n,
                "mm_alone_ms": 1e3 * mm_alone, "mm_with_ms": 1e3 * mm_with,
                "slowdown_pct": slowdown, "xfer_alone_gbps": nbytes / alone.median_s / 1e9,
                "xfer_overlap_gbps": overlap, "n_xfer": n_xfer,
                "target": target if knobs["block_quota"] == 2 else None,
            })
            log(f"sm-cost {name} bq={knobs['block_quota']}: {slowdown:+.2f}%")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--block-quota", default="2", help="comma-separated block quotas")
    ap.add_argument("--num-warps", type=int, default=32)
    ap.add_argument("--item", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--json", default="results/bench_sm_cost.json")
    args = ap.parse_args()
    device = pick_device("auto")
    clock = Clock(device, warmup=2, samples=5, min_sample_s=2e-3)
    shape = Shape(args.item, 1, args.tokens, args.layers)
    pools = Arenas([shape], device, d2d=False).pools(shape, d2d=False, n_sets=4)
    knobs = [{"block_quota": int(q), "num_warps_per_block": args.num_warps}
             for q in args.block_quota.split(",")]
    results = sm_cost(clock, import_hicache("kernels"), pools, knobs)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(render_sm_cost(results))


if __name__ == "__main__":
    main()
