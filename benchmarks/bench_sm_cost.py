"""What a transfer costs the model: a compute-bound bf16 matmul loop alone vs with a transfer.

The transfer (per-layer loads, or all-layer backups, of scattered 2 KiB slots) runs on its own
stream with a small ``block_quota``; both streams are released together after a sleep gate, the
matmul loop is timed with events on the compute stream, and each finished transfer records an
event, so the transfer's bandwidth *while overlapped* is reported next to its bandwidth alone.

A reference row, ``idle blocks``, runs a kernel of the same launch shape whose programs only
sleep: the slowdown that holding ``block_quota`` SMs alone costs the matmul, with no memory
traffic. The transfer's own cost is what it adds on top.

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
import triton
import triton.language as tl
from _common import Clock, import_hicache, log, pick_device
from _kv_buffers import Arenas, Pools, Shape
from _report import SLOWDOWN_TARGET_PCT, render_sm_cost
from _transfer_cases import bind, spec

TRANSFERS = {
    "load per_layer": spec("per_layer", "load"),
    "backup all_layer": spec("all_layer", "backup"),
}
# Copy-engine transfers (no launch shape, no knobs); measured on whole pages of >= 64 KiB.
DIRECT_TRANSFERS = {
    "load direct": spec("direct", "load"),
    "backup direct": spec("direct", "backup"),
}
NO_KNOBS = {"block_quota": "-", "num_warps_per_block": "-"}
IDLE_NS = 2_000_000  # one idle-blocks launch: about as long as one per-layer load


@triton.jit
def _idle_blocks(out, ns):
    """Each program stays resident ``ns`` nanoseconds, asleep: occupancy with no work."""
    start = tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l,l", [ns], dtype=tl.int64, is_pure=False, pack=1
    )
    now = start
    while now - start < ns:
        now = tl.inline_asm_elementwise(
            "nanosleep.u32 2000; mov.u64 $0, %globaltimer;",
            "=l,l",
            [ns],
            dtype=tl.int64,
            is_pure=False,
            pack=1,
        )
    tl.store(out + tl.program_id(0), now - start)


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


def _overlap_once(
    clock: Clock,
    loop: Callable[[], None],
    xfer: Callable[[int], None],
    n_xfer: int,
    stream: torch.cuda.Stream,
    gate_s: float,
):
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
    return (
        start.elapsed_time(end) / 1e3,
        go.elapsed_time(end) / 1e3,
        [go.elapsed_time(e) / 1e3 for e in done],
    )


def _overlap_gbps(mm_end_s: float, finished_s: list[float], nbytes: int) -> float:
    n = sum(t <= mm_end_s for t in finished_s)
    return n * nbytes / finished_s[n - 1] / 1e9 if n else 0.0


def _idle(scratch: torch.Tensor, block_quota: int, num_warps: int) -> Callable[[int], None]:
    """``fn(k)`` launching the idle-blocks kernel in the copy's launch shape."""
    return lambda k: _idle_blocks[(block_quota,)](scratch, IDLE_NS, num_warps=num_warps)


def _cost(
    clock: Clock,
    loop: Callable[[], None],
    loop_cpu_s: float,
    xfer: Callable[[int], None],
    nbytes: int,
    stream: torch.cuda.Stream,
    loop_s: float,
    reps: int,
) -> dict:
    """Matmul loop alone vs with ``xfer`` calls back to back on ``stream``."""
    alone = clock.measure(xfer)
    n_xfer = min(400, math.ceil(1.3 * loop_s / alone.median_s) + 1)
    gate_s = 1.5 * (n_xfer * alone.cpu_s + loop_cpu_s) + 2e-3
    runs = [
        _overlap_once(clock, loop, xfer, n, stream, gate_s)
        for _ in range(reps)
        for n in (0, n_xfer)
    ]
    mm_alone = statistics.median(r[0] for r in runs[0::2])
    mm_with = statistics.median(r[0] for r in runs[1::2])
    overlap = statistics.median(_overlap_gbps(r[1], r[2], nbytes) for r in runs[1::2])
    return {
        "mm_alone_ms": 1e3 * mm_alone,
        "mm_with_ms": 1e3 * mm_with,
        "slowdown_pct": 100.0 * (mm_with / mm_alone - 1.0),
        "xfer_alone_gbps": nbytes / alone.median_s / 1e9,
        "xfer_overlap_gbps": overlap,
        "n_xfer": n_xfer,
    }


def sm_cost(
    clock: Clock,
    kernels: ModuleType,
    pools: Pools,
    knobs_list: list[dict],
    *,
    transfers: dict | None = None,
    mm_n: int = 8192,
    loop_s: float = 0.05,
    reps: int = 5,
) -> list[dict]:
    """Matmul slowdown (%) per transfer kind and knob setting, after the idle-blocks reference
    of each setting; [] on CPU. ``transfers`` defaults to the kernel ops; with
    ``DIRECT_TRANSFERS`` pass ``[NO_KNOBS]`` (there is no launch shape, so no idle reference)."""
    transfers = TRANSFERS if transfers is None else transfers
    if not clock.cuda:
        log("sm-cost: skipped (needs CUDA)")
        return []
    loop, loop_cpu_s = _matmul_loop(clock, mm_n, loop_s)
    stream = torch.cuda.Stream(device=clock.device)
    scratch = torch.empty(1024, dtype=torch.int64, device=clock.device)
    out = []
    for knobs in knobs_list:
        bq, nw = knobs["block_quota"], knobs["num_warps_per_block"]
        cases = (
            [] if knobs is NO_KNOBS else [("idle blocks", "none", _idle(scratch, bq, nw), 0, None)]
        )
        for name, sp in transfers.items():
            nbytes = sp.bytes_moved(pools.shape, pools.shape.tokens)
            target = {"threshold": SLOWDOWN_TARGET_PCT} if bq in (2, "-") else None
            cases.append(
                (name, sp.op, bind(kernels, sp, pools, pools.shape.tokens, knobs), nbytes, target)
            )
        for name, op, xfer, nbytes, target in cases:
            r = _cost(clock, loop, loop_cpu_s, xfer, nbytes, stream, loop_s, reps)
            if target is not None:
                target = {**target, "passed": r["slowdown_pct"] <= SLOWDOWN_TARGET_PCT}
            out.append({"transfer": name, "op": op, **knobs, "mm_n": mm_n, **r, "target": target})
            log(f"sm-cost {name} bq={bq} nw={nw}: {r['slowdown_pct']:+.2f}%")
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
    knobs = [
        {"block_quota": int(q), "num_warps_per_block": args.num_warps}
        for q in args.block_quota.split(",")
    ]
    results = sm_cost(clock, import_hicache("kernels"), pools, knobs)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(render_sm_cost(results))


if __name__ == "__main__":
    main()
