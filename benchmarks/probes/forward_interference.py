"""Probe: does a host-to-device copy in flight slow a device-hit request that does not wait on it?

The 8k/256 cell of ``bench_overlap.py`` is bound by launching the forward's kernels (its
forward call's CPU time is ~90 % of the TTFT). Here the same engine serves the same device hit,
alternately quiet and with an unrelated pinned copy (about as many bytes as the prefix's KV)
queued on a side stream just before the request: TTFT and the forward call's CPU time of both.
``--copies``: ``ce``, one copy-engine copy (``Tensor.copy_``); ``ce_d2h``, the same copy
device to host (a backup's direction); ``kernel``, the transfer kernel
(``transfer_kv_per_layer``, ``block_quota=2``) layer by layer over 2 KiB items, SM-issued.

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

kernels = bench_overlap.import_hicache("kernels")


def _copy(name: str, src: torch.Tensor, dst: torch.Tensor, idx: torch.Tensor) -> None:
    """Queue ``src`` ([2, layers, tokens, 2048] pinned) -> ``dst`` on the current stream."""
    if name == "ce":
        dst.copy_(src, non_blocking=True)
        return
    if name == "ce_d2h":  # the other direction: what a write-through backup moves
        src.copy_(dst, non_blocking=True)
        return
    for layer in range(src.shape[1]):
        k, v = (src[0, layer], dst[0, layer]), (src[1, layer], dst[1, layer])
        kernels.transfer_kv_per_layer(k[0], k[1], v[0], v[1], idx, idx, 2048)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default="8k/256")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--copies", default="ce,ce_d2h,kernel")
    args = parser.parse_args()
    args.pairs = bench_overlap.parse_pairs(args.pairs)
    args.host_ratio, args.seed, args.profile = 1.1, 0, False
    device = torch.device("cuda")
    model = bench_overlap.build_model("llama3-8b", device)
    bench = bench_overlap.Bench(model, args.backend, None, 64, args)
    side = torch.cuda.Stream(device=device)
    for prefix_len, suffix_len in args.pairs:
        kv_bytes = prefix_len * model.cfg.num_layers * 2 * model.cfg.num_kv_heads * 128 * 2
        layers = model.cfg.num_layers
        src = torch.empty(2, layers, prefix_len, 2048, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(2, layers, prefix_len, 2048, dtype=torch.uint8, device=device)
        assert src.numel() == kv_bytes
        idx = torch.arange(prefix_len, device=device)
        names = ["quiet", *args.copies.split(",")]
        prefix = bench.tokens(prefix_len)
        bench.ttft(prefix + bench.tokens(suffix_len))
        bench.quiet(to_host=False)
        rows: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        for i in range(len(names) * (args.repeats + 1)):
            name = names[i % len(names)]
            if name != "quiet":
                with torch.cuda.stream(side):
                    _copy(name, src, dst, idx)
            bench.forward.seconds = 0.0
            req = bench.ttft(prefix + bench.tokens(suffix_len))
            if i >= len(names):
                rows[name].append((req.first_token_time - req.arrival, bench.forward.seconds))
            torch.cuda.synchronize()
        for name, samples in rows.items():
            ttft = statistics.median(s[0] for s in samples) * 1e3
            fwd = statistics.median(s[1] for s in samples) * 1e3
            print(f"{prefix_len}/{suffix_len} {name:8s} TTFT {ttft:6.1f} ms  "
                  f"forward CPU {fwd:6.1f} ms  ({len(samples)} runs)")  # fmt: skip
    bench.close()


if __name__ == "__main__":
    main()
