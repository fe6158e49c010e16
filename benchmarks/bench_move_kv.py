"""move_kv_cache throughput against a device-to-device ``copy_`` of the same bytes.

For each geometry and N, a pool's ``move_kv_cache(tgt, src)`` moves N random slots (targets
distinct, sources drawn from the same slots, so the sets overlap) in every row buffer of every
layer. GB/s counts the bytes *moved* (N x bytes per token over all layers and buffers; each is
read once and written once, so the memory traffic is twice that). ``copy_`` is one contiguous
``dst.copy_(src)`` of the same number of bytes: the ceiling. ``native`` is the torch path.
Geometries: a 32-layer 8B model (8 KV heads x 128, bf16) and an MLA latent (576, bf16).
On CUDA by default; ``--quick`` is a tiny CPU smoke (Triton only under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from _common import Clock, fmt_size, format_table, import_hicache, pick_device

GB = 1e9


def _pools(size: int, layers: int, device: torch.device) -> dict[str, Any]:
    pools = import_hicache("pools")
    kw = {"enable_kv_cache_copy": True}
    return {
        f"MHA {layers}L 8x128 bf16": pools.MHATokenToKVPool(
            size, 16, torch.bfloat16, 8, 128, layers, device, **kw
        ),
        f"MLA {layers}L 576 bf16": pools.MLATokenToKVPool(
            size, 16, torch.bfloat16, 512, 64, layers, device, **kw
        ),
    }


def _moves(pool: Any, n: int, device: torch.device, rounds: int) -> list[tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(n)
    out = []
    for _ in range(rounds):
        slots = torch.randperm(pool.num_slots - 16, generator=gen)[: n + n // 2] + 16
        src = slots[torch.randint(0, slots.numel(), (n,), generator=gen)]
        out.append((slots[:n].to(device), src.to(device)))
    return out


def _bytes_per_token(pool: Any) -> int:
    bufs = [b for kind in pool.row_buffers for b in kind]
    return sum(b[0].numel() * b.element_size() for b in bufs)


def _row(name: str, pool: Any, n: int, clock: Clock, paths: list[str]) -> list[str]:
    device = pool.device
    moved = n * _bytes_per_token(pool)
    moves = _moves(pool, n, device, 4)
    src = torch.empty(moved, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    cells = [name, str(n), fmt_size(moved)]
    for path in paths:
        pool.use_native_move_kv_cache = path == "native"

        def run(k: int) -> None:
            pool.move_kv_cache(*moves[k % len(moves)])

        cells.append(f"{moved / clock.measure(run).median_s / GB:.3g}")
    cells.append(f"{moved / clock.measure(lambda k: dst.copy_(src)).median_s / GB:.3g}")
    return cells


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--quick", action="store_true", help="tiny CPU smoke")
    ap.add_argument("--sizes", default="64,512,4096,32768", help="N, slots moved per call")
    args = ap.parse_args()
    device = torch.device("cpu") if args.quick else pick_device(args.device)
    ns = [8, 200] if args.quick else [int(s) for s in args.sizes.split(",")]
    layers, size = (2, 512) if args.quick else (32, 65536)
    env = import_hicache("env")
    paths = ["triton", "native"] if device.type == "cuda" or env.ENV.triton_interpret else []
    paths = paths or ["native"]
    clock = Clock(device, warmup=1 if args.quick else 3, samples=3 if args.quick else 15,
                  min_sample_s=0.0 if args.quick else 0.002)  # fmt: skip
    rows = []
    for name, pool in _pools(size, layers, device).items():
        rows += [_row(name, pool, n, clock, paths) for n in ns]
        del pool
    header = ["geometry", "N", "moved", *(f"{p} GB/s" for p in paths), "copy_ GB/s"]
    print(format_table(header, rows, f"move_kv_cache on {device} (GB/s of bytes moved)"))


if __name__ == "__main__":
    main()
