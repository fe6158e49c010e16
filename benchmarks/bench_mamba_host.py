"""MambaPoolHost transfers of whole recurrent states vs one contiguous copy of the same bytes.

A backup (device -> host) and a load (host -> device) of ``--states`` states from scattered
device slots, each state ``--layers`` layers of one conv tensor ``(conv_dim, 3)`` (bf16) and a
temporal state ``(heads, head_dim, state)`` (fp32) (default: about a Qwen3-Next linear layer),
timed against one contiguous copy of as many bytes between the same kinds of memory. The ratio
(state transfer time / contiguous copy time) is measured in one run.

    python benchmarks/bench_mamba_host.py --device cuda --json mamba_host.json
"""

from __future__ import annotations

import argparse
import json

import torch
from _common import Clock, describe_device, format_table, host_arena, import_hicache, pick_device


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--states", type=int, default=8)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--conv-dim", type=int, default=8192)
    ap.add_argument("--temporal", default="32,128,128", help="heads,head_dim,state")
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--json", default="")
    return ap.parse_args()


def build(args: argparse.Namespace, device: torch.device) -> tuple[object, object]:
    pools = import_hicache("pools")
    params = pools.MambaStateParams(
        layers=list(range(args.layers)),
        conv=[(args.conv_dim, 3)],
        temporal=tuple(int(x) for x in args.temporal.split(",")),
    )
    device_pool = pools.MambaPool(size=2 * args.states, cache_params=params, device=device)
    device_pool.alloc(2 * args.states)
    for info in device_pool.state_tensors:
        info.tensor.view(torch.uint8).random_(0, 256)
    return device_pool, pools.MambaPoolHost(device_pool, size=args.states)


def main() -> None:
    args = parse_args()
    device = pick_device(args.device)
    device_pool, host = build(args, device)
    dev_slots = torch.arange(2, 2 * args.states + 1, 2, dtype=torch.int64)  # scattered
    host_slots = host.alloc(args.states)
    nbytes = args.states * host.slot_bytes
    arena = host_arena(nbytes, device)
    dev_buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
    clock = Clock(device, warmup=2, samples=args.samples, min_sample_s=0.0)
    times = {
        "backup": clock.measure(
            lambda k: host.backup_from_device(device_pool, dev_slots, host_slots)
        ),
        "load": clock.measure(lambda k: host.load_to_device(device_pool, host_slots, dev_slots)),
        "d2h contiguous": clock.measure(lambda k: arena.copy_(dev_buf, non_blocking=True)),
        "h2d contiguous": clock.measure(lambda k: dev_buf.copy_(arena, non_blocking=True)),
    }
    base = {"backup": "d2h contiguous", "load": "h2d contiguous"}
    rows = []
    for name, t in times.items():
        ratio = t.median_s / times[base[name]].median_s if name in base else 1.0
        rows.append([name, f"{nbytes / 1e6:.2f}", f"{t.median_s * 1e3:.3f}",
                     f"{nbytes / t.median_s / 1e9:.1f}", f"{ratio:.2f}"])  # fmt: skip
    header = ["op", "MB", "ms", "GB/s", "time / contiguous"]
    title = f"{args.states} states x {host.slot_bytes / 1e6:.2f} MB on {device}"
    print(format_table(header, rows, title))
    if args.json:
        report = {"device": describe_device(device), "args": vars(args), "rows": rows}
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
