"""Host pool start-up: seconds to allocate and page-lock host buffers of a given size, per method.

Methods (``--methods``):
  register     one ``cudaHostRegister`` of a fresh buffer (the driver faults pages in, one thread)
  touch        pages faulted in by ``--threads`` threads first, then one registration
  thp          as ``touch`` after ``madvise(MADV_HUGEPAGE)``
  chunks       ``hicache.pools.host_memory.pin_buffer`` (huge pages, parallel touch, parallel
               registration in 1 GiB chunks): what host pools do
  chunks_4k    ``chunks`` without the huge-page advice
  alloc        ``torch.empty(pin_memory=True)`` (``cudaHostAlloc``, rounded up to a power of two)
  pool         a whole ``MHATokenToKVPoolHost`` (Llama-3-8B geometry, layer_first) of that size

Sizes above ``--max-fraction`` of available RAM are skipped and reported as such. On a machine
without CUDA only the touch part runs (nothing can be pinned). Prints a table, writes JSON.

    python3 benchmarks/bench_host_pool.py --sizes-gib 16,64,128
    python3 benchmarks/bench_host_pool.py --sizes-gib 1 --methods touch,thp   # CPU smoke run
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import torch
from _common import format_table, import_hicache

GIB = 1 << 30
ALL = ("register", "touch", "thp", "chunks", "chunks_4k", "alloc", "pool")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-gib", default="16,64,128", help="buffer sizes in GiB")
    ap.add_argument("--methods", default=",".join(ALL), help=f"subset of {ALL}")
    ap.add_argument("--large-methods", default="register,chunks,pool", help="methods > 16 GiB")
    ap.add_argument("--threads", type=int, default=0, help="0: host_memory.worker_count")
    ap.add_argument("--max-fraction", type=float, default=0.85, help="of available RAM")
    ap.add_argument("--json", default="results/bench_host_pool.json")
    return ap.parse_args()


def _one_register(buf: torch.Tensor, devices, cuda: bool) -> Callable[[], None]:
    if not cuda:
        return lambda: None
    devices.pin_tensor(buf)
    return lambda: devices.unpin_tensor(buf)


def run_method(method: str, nbytes: int, threads: int | None) -> dict:
    """Seconds to allocate and pin ``nbytes`` with ``method`` (and to release it)."""
    mem, devices = import_hicache("pools.host_memory"), import_hicache("devices")
    cuda = torch.cuda.is_available()
    t0 = time.perf_counter()
    row: dict = {"method": method, "gib": nbytes / GIB}
    if method == "alloc":
        buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
        release: Callable[[], None] = lambda: None  # noqa: E731
    elif method == "pool":
        buf, release = _pool(nbytes), lambda: None
    else:
        buf = torch.empty(nbytes, dtype=torch.uint8)
        if method in ("chunks", "chunks_4k"):
            chunks, times = (
                mem.pin_buffer(buf, 1 << 21, threads=threads, huge_pages=method == "chunks")
                if cuda
                else ([], None)
            )
            row.update(chunks=len(chunks), huge_pages=times.huge_pages if times else None)
            release = lambda: mem.unpin_chunks(chunks)  # noqa: E731
        else:
            if method in ("touch", "thp"):
                row["huge_pages"] = method == "thp" and mem.advise_huge_pages(buf)
                parts = [buf[lo:hi] for lo, hi in mem.chunk_bounds(nbytes, 1 << 21)]
                workers = mem.worker_count(len(parts), threads)
                mem.touch_pages(parts, workers)
                row["touch_s"] = time.perf_counter() - t0
            release = _one_register(buf, devices, cuda)
    if cuda:
        torch.cuda.synchronize()
    row["seconds"] = time.perf_counter() - t0
    row["gbps"] = nbytes / row["seconds"] / 1e9
    t1 = time.perf_counter()
    release()
    del buf
    gc.collect()
    row["release_s"] = time.perf_counter() - t1
    return row


def _pool(nbytes: int):
    pools = import_hicache("pools")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = pools.MHATokenToKVPool(64, 64, torch.bfloat16, 8, 128, 32, device)
    return pools.MHATokenToKVPoolHost(dev, 0, nbytes / 1e9, 64, "layer_first")


def cross_registration_probe() -> dict[str, str]:
    """Whether one copy may span two registrations: ``copy_`` and a copy-engine batch, both ways,
    over a 2 MiB range across the boundary of two 4 MiB registrations (bytes checked)."""
    if not torch.cuda.is_available():
        return {"cross-registration copies": "no CUDA"}
    devices, engine = import_hicache("devices"), import_hicache("kernels.copy_engine")
    np = __import__("numpy")
    host = torch.empty(8 << 20, dtype=torch.uint8)
    halves = [host[: 4 << 20], host[4 << 20 :]]
    for h in halves:
        devices.pin_tensor(h)
    out: dict[str, str] = {}
    stream = torch.cuda.Stream()
    try:
        with torch.cuda.stream(stream):
            for name in ("copy_", "engine"):
                src = torch.randint(0, 256, (2 << 20,), dtype=torch.uint8, device="cuda")
                back = torch.empty_like(src)
                span = host[3 << 20 : 5 << 20]
                try:
                    if name == "copy_":
                        span.copy_(src, non_blocking=True)
                        back.copy_(span, non_blocking=True)
                    else:
                        n = np.array([2 << 20])
                        engine.copy_batch(
                            np.array([span.data_ptr()]), np.array([src.data_ptr()]), n, src.device
                        )
                        engine.copy_batch(
                            np.array([back.data_ptr()]), np.array([span.data_ptr()]), n, src.device
                        )
                    stream.synchronize()
                    out[name] = "ok" if torch.equal(back, src) else "WRONG BYTES"
                except RuntimeError as e:
                    out[name] = f"error: {e}"[:120]
    finally:
        for h in halves:
            devices.unpin_tensor(h)
    return {f"cross-registration {k}": v for k, v in out.items()}


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    methods = [m for m in args.methods.split(",") if m]
    large = set(args.large_methods.split(","))
    threads = args.threads or None
    rows: list[dict] = []
    for gib in [float(x) for x in args.sizes_gib.split(",") if x]:
        nbytes = int(gib * GIB)
        room = psutil.virtual_memory().available * args.max_fraction
        for method in methods if gib <= 16 else [m for m in methods if m in large]:
            if nbytes > room:
                rows.append({"method": method, "gib": gib, "note": f"skipped: > {room / GIB:.0f}"})
                continue
            try:
                rows.append(run_method(method, nbytes, threads))
            except (RuntimeError, ValueError, MemoryError) as e:
                rows.append({"method": method, "gib": gib, "note": f"{type(e).__name__}: {e}"})
            print(rows[-1], flush=True)
    vm = psutil.virtual_memory()
    meta = {
        "ram_gib": vm.total / GIB,
        "available_gib": vm.available / GIB,
        "cuda": torch.cuda.is_available(),
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    header = ["GiB", "method", "seconds", "GB/s", "touch s", "chunks", "huge", "release s", "note"]
    table = [
        [
            f"{r['gib']:g}",
            r["method"],
            f"{r['seconds']:.2f}" if "seconds" in r else "-",
            f"{r['gbps']:.1f}" if "gbps" in r else "-",
            f"{r['touch_s']:.2f}" if "touch_s" in r else "-",
            str(r.get("chunks", "-")),
            str(r.get("huge_pages", "-")),
            f"{r['release_s']:.2f}" if "release_s" in r else "-",
            r.get("note", ""),
        ]
        for r in rows
    ]
    probe = cross_registration_probe()
    meta.update(probe)
    Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\nRAM {meta['ram_gib']:.0f} GiB, available {meta['available_gib']:.0f} GiB; {probe}")
    print(format_table(header, table, "== host pool start-up (allocate + page-lock) =="))


if __name__ == "__main__":
    main()
