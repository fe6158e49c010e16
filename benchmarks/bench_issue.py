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
reference's and dominate). ``--profile N`` also prints cProfile's top functions (own time) of
``N`` per-layer loops and ``N`` whole batches of each row.

``TRITON_INTERPRET=1 ... --stub`` (any machine, CPU tensors): the Python cost alone, with
Triton's kernel and the batched engine copy replaced by no-ops: per layer, a plan launched
layer by layer with every launch prepared again (``dispatch.run(plan.at(l))``; direct:
``Runs.copy``, the addresses again) against ``plan.run(l)`` (prepared once per batch), the plan
itself included in both; then, on CPU pools of ``STUB_DIMS``, ``plan`` (``HostKVPool.plan_load``)
and ``batch`` (load + start_loading), as above. On CPU the controller neither sorts nor moves
the indices (no stream) and every index range is checked (CUDA indices are not).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from _common import format_table, import_hicache, pick_device
from triton.compiler import CompiledKernel

pools = import_hicache("pools")
kernels = import_hicache("kernels")
dispatch = import_hicache("kernels.dispatch")
triton_ops = import_hicache("kernels.triton_ops")
copy_engine = import_hicache("kernels.copy_engine")
direct_plan = import_hicache("kernels.direct_plan")
controller_mod = import_hicache("controller")
devices = import_hicache("devices")

LAYERS, HEADS, DIM = 32, 8, 128
STUB_DIMS = (8, 8)  # the stubbed pools' (heads, head dim): small, their Python cost is the same


def _per_layer_us(fn: Callable[[], None], sync: Callable[[], None], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) / LAYERS * 1e6)
    sync()
    return statistics.median(samples)


def _setup(backend: str, page: int, tokens: int, device: torch.device, dims: tuple[int, int]):
    """A 32-layer MHA pool pair of ``dims`` (heads, head dim) for ``tokens`` slots, its
    controller, and ``tokens`` scattered host slots, whole pages."""
    dev = pools.MHATokenToKVPool(2 * tokens, page, torch.bfloat16, *dims, LAYERS, device)
    alloc = pools.TokenToKVPoolAllocator(2 * tokens, page, device, kvcache=dev)
    host = pools.MHATokenToKVPoolHost(dev, 1.25, 0, page, "layer_first")  # pinning takes time
    ctrl = controller_mod.HiCacheController(alloc, host, page, io_backend=backend)
    gen = torch.Generator().manual_seed(0)
    pages = torch.randperm(host.size // page, generator=gen)[: tokens // page]
    h = (pages[:, None] * page + torch.arange(page)).flatten()
    return dev, alloc, host, ctrl, h


def _batch_us(
    ctrl: Any, alloc: Any, h: torch.Tensor, sync: Callable[[], None], repeats: int
) -> float:
    """``HiCacheController.load`` + ``start_loading`` of one batch of ``h``, per layer."""
    samples = []
    for _ in range(repeats + 1):  # the first one warms up
        sync()
        samples.append(_one_batch(ctrl, alloc, h, sync) / LAYERS * 1e6)
    return statistics.median(samples[1:])


def _one_batch(ctrl: Any, alloc: Any, h: torch.Tensor, sync: Callable[[], None]) -> float:
    """Seconds of ``load`` + ``start_loading`` of one batch; then it lands and is freed."""
    t0 = time.perf_counter()
    slots = ctrl.load(h, 0)
    ctrl.start_loading()
    seconds = time.perf_counter() - t0
    sync()
    ctrl.ack_load_queue.clear()
    assert slots is not None
    alloc.free(slots)
    return seconds


def _profile(label: str, fn: Callable[[], object], sync: Callable[[], None], times: int) -> None:
    """Print the top functions (own time) of ``times`` calls of ``fn`` under cProfile."""
    prof = cProfile.Profile()
    for _ in range(times):
        sync()
        prof.enable()
        fn()
        prof.disable()
    sync()
    print(f"--- profile: {label}, {times} calls")
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


def _row(
    backend: str, page: int, tokens: int, device: torch.device, repeats: int, profile: int = 0
) -> list[str]:
    dev, alloc, host, ctrl, h = _setup(backend, page, tokens, device, (HEADS, DIM))
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
        if profile:
            _profile(f"{backend} p{page} {tokens}: run+event", runs_events, sync, profile)
    alloc.free(d)
    cells.append(_batch_us(ctrl, alloc, h, sync, repeats))
    if profile:
        label = f"{backend} p{page} {tokens}: batch (load + start_loading, sync, free)"
        _profile(label, lambda: _one_batch(ctrl, alloc, h, sync), sync, profile)
    host.close()
    return [backend, str(page), str(tokens), *(f"{c:.1f}" for c in cells)]


class _StubCompiled(CompiledKernel):
    def __init__(self) -> None:  # nothing compiled
        pass

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, stream=None: None


class _StubJit:
    arg_names = triton_ops.transfer_kernel.arg_names

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return lambda *args, **kwargs: _StubCompiled()


def _stub_row(backend: str, page: int, tokens: int, repeats: int) -> list[str]:
    size = 4 * tokens
    bufs = [[torch.empty(size, HEADS, DIM, dtype=torch.bfloat16) for _ in range(4)]
            for _ in range(LAYERS)]  # fmt: skip
    gen = torch.Generator().manual_seed(page)
    h, d = (
        (torch.randperm(size // page, generator=gen)[: tokens // page, None] * page
         + torch.arange(page)).flatten()
        for _ in range(2)
    )  # fmt: skip
    make: Callable[[], Any]
    again: Callable[[Any, int], None]
    if backend == "kernel":
        src = [{"src_k": b[0], "src_v": b[1]} for b in bufs]
        dst = [{"dst_k": b[2], "dst_v": b[3]} for b in bufs]

        def make() -> Any:
            return kernels.plan_per_layer(src, dst, h, d, HEADS * DIM * 2)

        def again(plan: Any, layer: int) -> None:
            dispatch.run(plan.at(layer), plan.block_quota, plan.num_warps_per_block)
    else:

        def make() -> Any:
            return kernels.plan_direct([b[:2] for b in bufs], [b[2:] for b in bufs], h, d, page)

        def again(plan: Any, layer: int) -> None:
            plan.runs.copy(plan.layer_pairs[layer], plan.engine)

    def per_layer() -> None:
        plan = make()
        for layer in range(LAYERS):
            again(plan, layer)

    def once() -> None:
        plan = make()
        for layer in range(LAYERS):
            plan.run(layer)

    cpu = torch.device("cpu")
    dev, alloc, host, ctrl, hp = _setup(backend, page, tokens, cpu, STUB_DIMS)
    dp = alloc.alloc(tokens)
    assert dp is not None

    def pool_plan() -> None:
        host.plan_load(dev, hp, dp, backend)

    with dispatch.force_backend("triton"):
        cells = [_per_layer_us(f, lambda: None, repeats) for f in (per_layer, once, pool_plan)]
        alloc.free(dp)
        cells.append(_batch_us(ctrl, alloc, hp, lambda: None, repeats))
    return [backend, str(page), str(tokens), *(f"{c:.1f}" for c in cells)]


def _stub_rows(args: argparse.Namespace) -> list[list[str]]:
    triton_ops.transfer_kernel = _StubJit()
    copy_engine.copy_batch = lambda dst, src, nbytes, device: None
    direct_plan.engine_device = lambda pairs: torch.device("cpu")
    return [
        _stub_row(backend, page, tokens, args.repeats)
        for backend in args.backends.split(",")
        for page in (int(p) for p in args.pages.split(","))
        for tokens in (int(t) for t in args.tokens.split(","))
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--tokens", default="1024,8192")
    parser.add_argument("--pages", default="1,64")
    parser.add_argument("--backends", default="kernel,direct")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--stub", action="store_true", help="Python cost only (see the module)")
    parser.add_argument("--profile", type=int, default=0, help="cProfile N batches per row")
    args = parser.parse_args()
    if args.stub:
        header = ["backend", "page", "tokens", "prepared per layer", "plan once", "plan", "batch"]
        title = f"Python us per layer of a {LAYERS}-layer batch, copies stubbed out"
        print(format_table(header, _stub_rows(args), title))
        return
    device = pick_device(args.device)
    rows = [
        _row(backend, page, tokens, device, args.repeats, args.profile)
        for backend in args.backends.split(",")
        for page in (int(p) for p in args.pages.split(","))
        for tokens in (int(t) for t in args.tokens.split(","))
    ]
    header = ["backend", "page", "tokens", "plan", "run", "run+event", "event", "batch"]
    print(format_table(header, rows, f"us per layer of a {LAYERS}-layer load batch on {device}"))


if __name__ == "__main__":
    main()
