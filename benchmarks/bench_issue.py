"""CPU cost of issuing one layer of a load batch, and where it goes.

For a 32-layer MHA pool (8 KV heads, head dim 128, bf16) and a batch of ``--tokens`` scattered
slots, on the load stream as ``HiCacheController`` issues it, the wall time per layer (median of
``--repeats`` batches, the GPU synchronized outside the timed loop) of:

* ``plan``: ``HostKVPool.plan_load`` once per batch, divided by the layers;
* ``run``: ``LoadPlan.run(l)`` (what the controller calls per layer);
* ``run+event``: ``LoadPlan.run(l)`` and ``LayerLoadingEvent.complete(l)`` (the whole per-layer
  step of ``start_loading``);
* ``event``: ``complete(l)`` alone (one event record);
* ``batch``: ``HiCacheController.load`` + ``start_loading`` of the whole batch, per layer.

Run: ``PYTHONPATH=. python3 benchmarks/bench_issue.py`` (CUDA; on CPU the copies are the torch
reference's and dominate).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from _common import format_table, import_hicache, pick_device

pools = import_hicache("pools")
controller_mod = import_hicache("controller")
devices = import_hicache("devices")

LAYERS, HEADS, DIM = 32, 8, 128


def _per_layer_us(fn: Callable[[], None], sync: Callable[[], None], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) / LAYERS * 1e6)
    sync()
    return statistics.median(samples)


def _row(backend: str, page: int, tokens: int, device: torch.device, repeats: int) -> list[str]:
    dev = pools.MHATokenToKVPool(2 * tokens, page, torch.bfloat16, HEADS, DIM, LAYERS, device)
    alloc = pools.TokenToKVPoolAllocator(2 * tokens, page, device, kvcache=dev)
    host = pools.MHATokenToKVPoolHost(dev, 1.25, 0, page, "layer_first")  # pinning takes time
    ctrl = controller_mod.HiCacheController(alloc, host, page, io_backend=backend)
    gen = torch.Generator().manual_seed(0)
    pages = torch.randperm(host.size // page, generator=gen)[: tokens // page]
    h = (pages[:, None] * page + torch.arange(page)).flatten()
    d = alloc.alloc(tokens)
    assert d is not None
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    stream = ctrl.load_stream
    with devices.stream_scope(stream):
        if backend == "kernel":
            hd = h.pin_memory().to(device) if device.type == "cuda" else h
            dd = d
        else:
            hd, dd = h, d.cpu()
        plan = host.plan_load(dev, hd, dd, backend)
        event = controller_mod.LayerLoadingEvent(LAYERS, device)

        def plan_only() -> None:
            host.plan_load(dev, hd, dd, backend)

        def runs() -> None:
            for layer in range(LAYERS):
                plan.run(layer)

        def runs_events() -> None:
            for layer in range(LAYERS):
                plan.run(layer)
                event.complete(layer)

        def events() -> None:
            for layer in range(LAYERS):
                event.complete(layer)

        runs_events()  # warm up: compile, load the runtime
        cells = [_per_layer_us(f, sync, repeats) for f in (plan_only, runs, runs_events, events)]

    def batch() -> None:
        slots = ctrl.load(h, 0)
        assert slots is not None
        ctrl.start_loading()
        sync()
        ctrl.ack_load_queue.clear()
        alloc.free(slots)

    batch()
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        slots = ctrl.load(h, 0)
        ctrl.start_loading()
        samples.append((time.perf_counter() - t0) / LAYERS * 1e6)
        sync()
        ctrl.ack_load_queue.clear()
        assert slots is not None
        alloc.free(slots)
    cells.append(statistics.median(samples))
    host.close()
    return [backend, str(page), str(tokens), *(f"{c:.1f}" for c in cells)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--tokens", default="1024,8192")
    parser.add_argument("--pages", default="1,64")
    parser.add_argument("--backends", default="kernel,direct")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    device = pick_device(args.device)
    rows = [
        _row(backend, page, tokens, device, args.repeats)
        for backend in args.backends.split(",")
        for page in (int(p) for p in args.pages.split(","))
        for tokens in (int(t) for t in args.tokens.split(","))
    ]
    header = ["backend", "page", "tokens", "plan", "run", "run+event", "event", "batch"]
    print(format_table(header, rows, f"us per layer of a {LAYERS}-layer load batch on {device}"))


if __name__ == "__main__":
    main()
