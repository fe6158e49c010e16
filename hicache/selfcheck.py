"""`hicache selfcheck`: offload and reload KV through every host layout and io_backend.

Staged kernel backups (``hicache.pools.backup_staging``) are checked too, as backend "staged".

Builds a small device pool (CUDA when available, else CPU) and a host pool per
(layout, io_backend) pair, backs random KV up to the host, poisons the device slots, loads the KV
back layer by layer, verifies every byte and prints what ran where and how fast.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

from hicache.devices import new_stream, stream_scope
from hicache.pools import (
    MHATokenToKVPool,
    MHATokenToKVPoolHost,
    MLATokenToKVPool,
    MLATokenToKVPoolHost,
    TokenToKVPoolAllocator,
)
from hicache.pools.backup_staging import BackupStaging

PAIRS = [
    ("layer_first", "kernel"),
    ("page_first", "kernel"),
    ("page_head", "kernel"),
    ("layer_first", "direct"),
    ("page_first_direct", "direct"),
    ("layer_first", "auto"),
    # kernel backups gathered through a device buffer, then copied per host run
    # (hicache.pools.backup_staging); loads on the kernel
    ("layer_first", "staged"),
    ("page_first", "staged"),
    ("page_head", "staged"),
]


@dataclass(frozen=True)
class Row:
    model: str
    layout: str
    io_backend: str
    device: str
    ok: bool
    mbytes: float
    backup_gbps: float
    load_gbps: float


def _device_pool(model: str, args: argparse.Namespace, device: str):
    common = dict(
        size=args.tokens,
        page_size=args.page_size,
        dtype=torch.bfloat16,
        layer_num=args.layers,
        device=device,
    )
    if model == "MHA":
        return MHATokenToKVPool(head_num=8, head_dim=128, **common)
    return MLATokenToKVPool(kv_lora_rank=512, qk_rope_head_dim=64, **common)


def _buffers(pool) -> list[torch.Tensor]:
    return list(pool.kv_buffer) if hasattr(pool, "kv_buffer") else pool.k_buffer + pool.v_buffer


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn, device: str) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def check_pair(model: str, layout: str, label: str, args: argparse.Namespace, device: str) -> Row:
    """Back up, poison, reload and compare one (model, layout, io_backend) combination
    (``label`` "staged": the kernel, backups through a staging buffer of several chunks)."""
    pool = _device_pool(model, args, device)
    for buf in _buffers(pool):
        buf.copy_(torch.randn(buf.shape).to(buf.dtype))
    host_cls = MHATokenToKVPoolHost if model == "MHA" else MLATokenToKVPoolHost
    host = host_cls(pool, 2.0, 0, args.page_size, layout, pin_memory=True)
    allocator = TokenToKVPoolAllocator(args.tokens, args.page_size, device, pool)
    n = args.tokens // 2
    dev_idx, host_idx = allocator.alloc(n), host.alloc(n)
    if dev_idx is None or host_idx is None:
        raise RuntimeError(f"selfcheck: the pools cannot hold {n} tokens")
    backend, extra = label, {}
    if label == "staged":
        backend, extra = "kernel", {"staging": BackupStaging(host, max(n // 4, args.page_size))}
    perm = torch.randperm(n // args.page_size) * args.page_size
    dev_idx = dev_idx.view(-1, args.page_size)[perm // args.page_size].reshape(-1)
    expected = [buf[dev_idx.cpu()].cpu().clone() for buf in _buffers(pool)]
    _sync(device)  # the buffers' fill above is done before the transfer stream starts
    with stream_scope(new_stream(device)):  # a transfer stream of its own, as the controller's
        page = slice(0, args.page_size)  # warm-up: compile the kernels outside the timed region
        host.backup_from_device_all_layer(pool, host_idx[page], dev_idx[page], backend, **extra)
        host.load_to_device_per_layer(pool, host_idx[page], dev_idx[page], 0, backend)
        t_backup = _timed(
            lambda: host.backup_from_device_all_layer(pool, host_idx, dev_idx, backend, **extra),
            device,
        )
        for buf in _buffers(pool):
            buf.view(torch.uint8)[dev_idx] = 0xAB  # poison: unwritten bytes show
        t_load = _timed(
            lambda: [host.load_to_device_per_layer(pool, host_idx, dev_idx, layer, backend)
                     for layer in range(args.layers)], device,
        )  # fmt: skip
    pairs = zip(_buffers(pool), expected, strict=True)
    ok = all(torch.equal(buf[dev_idx].cpu(), exp) for buf, exp in pairs)
    nbytes = sum(exp.numel() * exp.element_size() for exp in expected)
    host.close()
    return Row(
        model,
        layout,
        label,
        device,
        ok,
        nbytes / 1e6,
        nbytes / t_backup / 1e9,
        nbytes / t_load / 1e9,
    )


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="hicache selfcheck",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--tokens", type=int, default=4096, help="device pool size in tokens")
    parser.add_argument("--layers", type=int, default=4, help="KV layers of every pool")
    parser.add_argument("--page-size", type=int, default=16, help="tokens per page")
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="the device pool's device (cuda when available)",
    )
    args = parser.parse_args(argv)
    for name in ("tokens", "layers", "page_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.tokens % (2 * args.page_size):
        parser.error("--tokens must be a multiple of 2 * --page-size")
    return args


def _print_table(rows: list[Row]) -> None:
    head = (
        f"{'model':5} {'layout':17} {'backend':7} {'device':6} {'bytes':>9} "
        f"{'backup GB/s':>11} {'load GB/s':>10}  result"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r.model:5} {r.layout:17} {r.io_backend:7} {r.device:6} {r.mbytes:7.1f}MB "
            f"{r.backup_gbps:11.2f} {r.load_gbps:10.2f}  {'ok' if r.ok else 'MISMATCH'}"
        )


def main(argv: list[str] | None = None) -> int:
    """Run every (model, layout, io_backend) pair; exit status 1 on any byte mismatch."""
    args = _parse(argv)
    rows = [
        check_pair(model, layout, backend, args, args.device)
        for model in ("MHA", "MLA")
        for layout, backend in PAIRS
        if not (model == "MLA" and layout == "page_head")
    ]
    _print_table(rows)
    failed = sum(not r.ok for r in rows)
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0
