"""Probe: a kernel-backend backup, SM-issued vs staged (``hicache.pools.backup_staging``).

Llama-3-8B KV geometry (32 layers, 8 KV heads x 128, bf16: 2 KiB per token, layer and part),
page 1: ``--tokens`` scattered device slots backed up to consecutive host slots of a pinned
layer_first host pool. Per variant: the backup alone (GB/s from events, and the CPU time of the
call), then a compute-bound bf16 matmul loop on the default stream with the backup queued just
before it on a side stream: the loop's slowdown against the loop alone, and the backup's GB/s
while overlapped. ``kernel`` is the SM-issued backup (``block_quota=2``); ``staged qN`` gathers
with N programs into a ``--staging-mb`` buffer, then copies on the engines. The staged host
bytes are checked against the device slots.

    PYTHONPATH=. python3 benchmarks/probes/staged_backup.py [--tokens 16384] [--quotas 8,16,32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import format_table, import_hicache  # noqa: E402

pools = import_hicache("pools")
staging_mod = import_hicache("pools.backup_staging")


def _timed(stream: torch.cuda.Stream, call) -> tuple[float, torch.cuda.Event, torch.cuda.Event]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record(stream)
        t0 = time.perf_counter()
        call()
        cpu = time.perf_counter() - t0
        end.record(stream)
    return cpu, start, end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--quotas", default="8,16,32")
    parser.add_argument("--staging-mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--matmul", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=30, help="matmuls per loop (~the backup)")
    args = parser.parse_args()
    device, n = torch.device("cuda"), args.tokens
    dev = pools.MHATokenToKVPool(2 * n, 1, torch.bfloat16, 8, 128, 32, device)
    host = pools.MHATokenToKVPoolHost(dev, 1.1, 0, 1, "layer_first")
    for part in dev.part_buffers:
        for layer in part:
            layer.view(torch.uint8).random_(0, 256)
    src = torch.randperm(2 * n, device=device)[:n] + 1  # scattered, in no order
    dst = host.alloc(n)
    nbytes = n * 32 * 2 * dev.item_size
    slots = args.staging_mb * 2**20 // (2 * host.layout_dim)
    variants = {"kernel": None}
    for q in (int(x) for x in args.quotas.split(",")):
        variants[f"staged q{q}"] = staging_mod.BackupStaging(host, slots, block_quota=q)
    side = torch.cuda.Stream(device=device)
    a = torch.randn(args.matmul, args.matmul, device=device, dtype=torch.bfloat16)

    def backup(staging) -> None:
        extra = {} if staging is None else {"staging": staging}
        host.backup_from_device_all_layer(dev, dst, src, "kernel", **extra)

    def matmuls() -> None:
        for _ in range(args.iters):
            a @ a

    rows = []
    for name, staging in variants.items():
        backup(staging)  # warm-up (Triton compile, binding)
        torch.cuda.synchronize()
        alone, cpu_us, loop_alone, loop_with, overlapped = [], [], [], [], []
        for _ in range(args.repeats):
            cpu, s, e = _timed(side, lambda st=staging: backup(st))
            torch.cuda.synchronize()
            alone.append(nbytes / (s.elapsed_time(e) * 1e-3) / 1e9)
            cpu_us.append(cpu * 1e6)
            _, ms, me = _timed(torch.cuda.current_stream(), matmuls)
            torch.cuda.synchronize()
            loop_alone.append(ms.elapsed_time(me))
            _, s, e = _timed(side, lambda st=staging: backup(st))
            _, ms, me = _timed(torch.cuda.current_stream(), matmuls)
            torch.cuda.synchronize()
            loop_with.append(ms.elapsed_time(me))
            overlapped.append(nbytes / (s.elapsed_time(e) * 1e-3) / 1e9)
        if staging is not None:  # the staged bytes are the device slots' bytes
            for p, part in enumerate(dev.part_buffers):
                for layer in (0, 31):
                    got = host.host_parts[p][layer][dst].view(torch.uint8)
                    assert torch.equal(got, part[layer][src].view(torch.uint8).cpu()), name
        la, lw = statistics.median(loop_alone), statistics.median(loop_with)
        rows.append([
            name, f"{statistics.median(alone):.1f}", f"{statistics.median(cpu_us):.0f}",
            f"{la:.2f}", f"{lw:.2f}", f"{(lw / la - 1) * 100:+.1f}%",
            f"{statistics.median(overlapped):.1f}",
        ])  # fmt: skip
    copy = torch.empty(nbytes // 2, dtype=torch.uint8, pin_memory=True)
    d = torch.empty_like(copy, device=device)
    _, s, e = _timed(side, lambda: copy.copy_(d, non_blocking=True))
    torch.cuda.synchronize()
    print(f"contiguous D2H copy: {nbytes / 2 / (s.elapsed_time(e) * 1e-3) / 1e9:.1f} GB/s")
    header = [
        "backup",
        "GB/s alone",
        "cpu us",
        "mm alone ms",
        "mm with ms",
        "slowdown",
        "GB/s with",
    ]
    title = f"== {n} scattered tokens ({nbytes / 2**30:.2f} GiB), staging {args.staging_mb} MiB =="
    print(format_table(header, rows, title))


if __name__ == "__main__":
    main()
