"""Probe: does a host-to-device copy in flight slow a device-hit request that does not wait on it?

The 8k/256 cell of ``bench_overlap.py`` is bound by launching the forward's kernels (its
forward call's CPU time is ~90 % of the TTFT). Here the same engine serves the same device hit,
alternately quiet and with an unrelated pinned copy (about as many bytes as the prefix's KV)
queued on a side stream just before the request: TTFT and the forward call's CPU time of both.

    PYTHONPATH=. python3 benchmarks/probes/forward_interference.py [--pairs 8k/256] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_overlap  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default="8k/256")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()
    args.pairs = bench_overlap.parse_pairs(args.pairs)
    args.host_ratio, args.seed, args.profile = 1.1, 0, False
    device = torch.device("cuda")
    model = bench_overlap.build_model("llama3-8b", device)
    bench = bench_overlap.Bench(model, args.backend, None, 64, args)
    side = torch.cuda.Stream(device=device)
    for prefix_len, suffix_len in args.pairs:
        kv_bytes = prefix_len * model.cfg.num_layers * 2 * model.cfg.num_kv_heads * 128 * 2
        src = torch.empty(kv_bytes, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(kv_bytes, dtype=torch.uint8, device=device)
        prefix = bench.tokens(prefix_len)
        bench.ttft(prefix + bench.tokens(suffix_len))
        bench.quiet(to_host=False)
        rows: dict[str, list[tuple[float, float]]] = {"quiet": [], "copy in flight": []}
        for i in range(2 * args.repeats + 2):
            name = "quiet" if i % 2 == 0 else "copy in flight"
            if name != "quiet":
                with torch.cuda.stream(side):
                    dst.copy_(src, non_blocking=True)
            bench.forward.seconds = 0.0
            req = bench.ttft(prefix + bench.tokens(suffix_len))
            if i >= 2:
                rows[name].append((req.first_token_time - req.arrival, bench.forward.seconds))
            torch.cuda.synchronize()
        for name, samples in rows.items():
            ttft = statistics.median(s[0] for s in samples) * 1e3
            fwd = statistics.median(s[1] for s in samples) * 1e3
            print(f"{prefix_len}/{suffix_len} {name:15s} TTFT {ttft:6.1f} ms  "
                  f"forward CPU {fwd:6.1f} ms  ({len(samples)} runs)")  # fmt: skip
    bench.close()


if __name__ == "__main__":
    main()
