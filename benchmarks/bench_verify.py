"""What page integrity costs: backup and load-back time with ``verify`` "all"/"sample" vs "off".

Drives a ``HiCacheController`` over real pools exactly as ``HiRadixCache`` does (the tree's own
cost is left out): a backup is ``write`` + ``start_writing`` until its finish event (``all`` and
``sample`` add the checksum kernel on the write stream); a load-back is ``load`` +
``start_loading`` until the KV has landed (``off``: the finish event) or has landed *and* been
verified (``PageIntegrity.select`` picks the load-back: ``verify_load``, one blocking read).
``issue`` is the CPU time before control returns to the scheduler: ``off`` returns once the
layers are queued, so the forward pass overlaps the transfer; a verified load-back returns only
after it has landed and been checked, which is the main cost of a guarantee that nothing corrupt
is served (the overlap lost is at most the load time, here ``landed``).

A first table times the checksum kernels alone (CUDA events, device slots already in place) at
several grid sizes, to size ``RECORD_PROGRAMS``/``VERIFY_PROGRAMS``; GB/s counts KV bytes hashed.

Figures are medians over repeats; ``sample`` load-backs are timed per period of
``--sample-period`` load-backs (one verified), and the median of the per-period means is shown.
Slots are scattered pages of the device pool. Default geometry on CUDA: Llama-3-8B (32 layers,
8 KV heads, head_dim 128, bf16), 8k and 16k tokens at page sizes 1 and 64, host ``layer_first``.
On CPU a tiny geometry runs in seconds (a smoke test of the script, not a measurement).

    python3 benchmarks/bench_verify.py [--json bench_out/bench_verify.json] [--tokens 8K,16K]
        [--page-sizes 1,64] [--repeats 10] [--sample-period 8] [--layout layer_first]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from _common import describe_device, format_table, import_hicache, log, parse_sizes, pick_device

pools = import_hicache("pools")
controller = import_hicache("controller")
checksum = import_hicache("kernels.checksum")
MODES = ("off", "sample", "all")
PROGRAMS = (32, 128, 256, 1024)


def build(device: torch.device, tokens: int, page: int, cuda_geometry: bool, layout: str):
    """Device pool of ``2 * tokens`` slots, its allocator and a host pool twice as large."""
    layers, heads, dim, dtype = (
        (32, 8, 128, torch.bfloat16) if cuda_geometry else (2, 2, 8, torch.float32)
    )
    size = 2 * tokens
    kv = pools.MHATokenToKVPool(size, page, dtype, heads, dim, layers, device)
    for part in kv.part_buffers:
        for layer in part:
            layer.view(torch.uint8).random_(1, 256)
    allocator = pools.TokenToKVPoolAllocator(size, page, device, kvcache=kv)
    host = pools.MHATokenToKVPoolHost(kv, 2.0, 0, page, layout, io_backend="kernel")
    return kv, allocator, host


def scattered(allocator, tokens: int, page: int, seed: int) -> torch.Tensor:
    """``tokens`` device slots in whole pages picked at random from the whole pool."""
    every = allocator.alloc(allocator.size)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(allocator.size // page, generator=gen).to(every.device)
    pages = every.view(-1, page)[order]
    allocator.free(pages[tokens // page :].reshape(-1))
    return pages[: tokens // page].reshape(-1)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_backup(ctrl, slots: torch.Tensor, device: torch.device) -> tuple[float, torch.Tensor]:
    sync(device)
    t0 = time.perf_counter()
    host = ctrl.write(slots, 0)
    ctrl.start_writing()
    ctrl.ack_write_queue.pop().finish_event.synchronize()
    return time.perf_counter() - t0, host


def time_load(ctrl, host: torch.Tensor, device: torch.device) -> tuple[float, float]:
    """(issue, landed) seconds of one load-back of ``host``; frees its device slots."""
    sync(device)
    t0 = time.perf_counter()
    slots = ctrl.load(host, 0)
    verified = ctrl.integrity is not None and ctrl.integrity.select()
    ctrl.start_loading()
    if verified:
        assert ctrl.verify_load(host, slots) is None, "clean data failed verification"
    issue = time.perf_counter() - t0
    ctrl.ack_load_queue.pop().finish_event.synchronize()
    landed = time.perf_counter() - t0
    ctrl.token_to_kv_pool_allocator.free(slots)
    return issue, landed


def measure(
    mode: str, kv, allocator, host_pool, tokens: int, page: int, args, device: torch.device
) -> dict[str, float]:
    ctrl = controller.HiCacheController(
        allocator, host_pool, page, verify=mode, verify_sample_period=args.sample_period
    )
    slots = scattered(allocator, tokens, page, seed=tokens + page)
    backups = []
    for _ in range(args.warmup + args.repeats):
        seconds, host = time_backup(ctrl, slots, device)
        backups.append(seconds)
        host_pool.free(host)
    _, host = time_backup(ctrl, slots, device)
    allocator.free(slots)
    period = args.sample_period if mode == "sample" else 1
    for _ in range(args.warmup * period):  # whole periods: each timed period starts verified
        time_load(ctrl, host, device)
    loads = [[time_load(ctrl, host, device) for _ in range(period)] for _ in range(args.repeats)]
    host_pool.free(host)
    return {
        "kv_bytes_per_token": kv.item_size * kv.layer_num * 2,
        "backup_s": statistics.median(backups[args.warmup :]),
        "issue_s": statistics.median(statistics.fmean(x[0] for x in p) for p in loads),
        "landed_s": statistics.median(statistics.fmean(x[1] for x in p) for p in loads),
    }


def kernel_alone(
    kv, allocator, tokens: int, page: int, repeats: int, device: torch.device
) -> list[dict[str, object]]:
    """Median seconds of one record and one verify launch over ``tokens`` scattered slots."""
    slots = scattered(allocator, tokens, page, seed=tokens * 3 + page)
    rows = torch.arange(tokens // page)
    store = torch.zeros((tokens // page, kv.layer_num), dtype=torch.int64).pin_memory()
    out = []
    for programs in PROGRAMS:
        times = {}
        for name, op in (
            ("record", checksum.record_page_checksums),
            ("verify", checksum.verify_page_checksums),
        ):
            samples = []
            for _ in range(repeats + 1):
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                op(kv.part_buffers, slots, page, store, rows, max_programs=programs)
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1e3)
            times[name] = statistics.median(samples[1:])
        hashed = tokens * kv.item_size * kv.layer_num * 2
        out.append(
            {
                "tokens": tokens,
                "page_size": page,
                "programs": programs,
                "record_s": times["record"],
                "verify_s": times["verify"],
                "record_gbps": hashed / times["record"] / 1e9,
            }
        )
    allocator.free(slots)
    return out


def run(args) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    device = pick_device(args.device)
    cuda = device.type == "cuda"
    token_counts = (
        parse_sizes(args.tokens) if args.tokens else ([8192, 16384] if cuda else [64, 128])
    )
    page_sizes = (
        [int(p) for p in args.page_sizes.split(",")]
        if args.page_sizes
        else ([1, 64] if cuda else [1, 4])
    )
    rows, kernels = [], []
    for page in page_sizes:
        kv, allocator, host_pool = build(device, max(token_counts), page, cuda, args.layout)
        for tokens in token_counts:
            if cuda:
                kernels += kernel_alone(kv, allocator, tokens, page, args.repeats, device)
            for mode in MODES:
                log(f"page {page}, {tokens} tokens, verify={mode}")
                rows.append(
                    {
                        "tokens": tokens,
                        "page_size": page,
                        "verify": mode,
                        **measure(mode, kv, allocator, host_pool, tokens, page, args, device),
                    }
                )
        host_pool.close()
        del kv, allocator, host_pool
    for row in rows:
        off = next(
            r
            for r in rows
            if r["verify"] == "off"
            and r["tokens"] == row["tokens"]
            and r["page_size"] == row["page_size"]
        )
        for key in ("backup_s", "issue_s", "landed_s"):
            row[key.replace("_s", "_ratio")] = row[key] / off[key]
    return rows, kernels


def kernel_table(kernels: list[dict[str, object]]) -> str:
    header = ["tokens", "page", "programs", "record ms", "GB/s", "verify ms"]
    body = [
        [
            str(k["tokens"]),
            str(k["page_size"]),
            str(k["programs"]),
            f"{k['record_s'] * 1e3:.3f}",
            f"{k['record_gbps']:.0f}",
            f"{k['verify_s'] * 1e3:.3f}",
        ]
        for k in kernels
    ]
    return format_table(header, body, "checksum kernels alone (medians)")


def table(rows: list[dict[str, object]]) -> str:
    header = [
        "tokens",
        "page",
        "verify",
        "backup ms",
        "x off",
        "load landed ms",
        "x off",
        "load issue ms",
        "x off",
    ]
    body = [
        [
            str(r["tokens"]),
            str(r["page_size"]),
            str(r["verify"]),
            f"{r['backup_s'] * 1e3:.2f}",
            f"{r['backup_ratio']:.3f}",
            f"{r['landed_s'] * 1e3:.2f}",
            f"{r['landed_ratio']:.3f}",
            f"{r['issue_s'] * 1e3:.2f}",
            f"{r['issue_ratio']:.2f}",
        ]
        for r in rows
    ]
    title = (
        f"page integrity cost ({rows[0]['kv_bytes_per_token']} bytes of KV per token; "
        "medians; sample: mean per period)"
    )
    return format_table(header, body, title)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--tokens", default="", help="e.g. 8K,16K (default: 8K,16K on CUDA)")
    parser.add_argument("--page-sizes", default="", help="e.g. 1,64 (default on CUDA)")
    parser.add_argument("--layout", default="layer_first")
    parser.add_argument("--repeats", type=int, default=0, help="default: 10 on CUDA, 3 on CPU")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--sample-period", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.repeats = args.repeats or (10 if pick_device(args.device).type == "cuda" else 3)
    rows, kernels = run(args)
    device = pick_device(args.device)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        settings = {k: str(v) for k, v in vars(args).items()}
        payload = {
            "info": describe_device(device),
            "args": settings,
            "rows": rows,
            "kernels": kernels,
        }
        args.json.write_text(json.dumps(payload, indent=2))
        log(f"wrote {args.json}")
    if kernels:
        print(kernel_table(kernels) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
