"""TTFT of a host hit against a device hit: does the layer-wise load hide behind the forward?

A model with Llama-3-8B geometry (32 layers, hidden 4096, 32 query heads, 8 KV heads, head dim
128, MLP 14336, bf16, random weights; ``--geometry tiny`` for a CPU smoke run) serves one request
at a time through the project's ``Engine`` over a ``HiRadixCache``. For each prefix/suffix pair
and each repeat, with a fresh random prefix ``P`` and fresh suffixes:

* ``cold``: ``P + s0``, nothing cached (every token computed; its write-through backup starts).
* ``dev_busy``: ``P + s1`` right after ``cold``, while ``cold``'s backup of ``P + s0`` is still in
  flight (a device hit; the figure the issue wants unchanged by that backup).
* ``device``: ``P + s2`` after every transfer drained (the quiet device hit).
* ``host``: ``P + s3`` with ``P`` evicted to the host: loaded back layer by layer while the
  forward pass waits per layer (``LayerDoneCounter``).
* ``load``: ``P`` on the host again, loaded with no forward pass (match, plan, issue, landed).

TTFT is the engine's ``first_token_time - arrival`` (it includes issuing the request's own
backup, as the engine does before the token is returned). Each figure is the median over
``--repeats``. ``overlap = (device + load - host) / min(device, load)``: 1 when the load hides
completely behind the forward pass, 0 when they run one after the other. ``issue_us`` is the
CPU time of ``ready_to_load_host_cache`` per layer of the host hit's load batch; ``host_cpu_ms``
the CPU time of its ``match_prefix`` + ``init_load_back`` calls (host-side match/plan work).
``fwd cpu`` is the CPU time of the model's forward call in the device and the host hit: when it
is close to the TTFT, the forward pass is bound by launching its kernels, not by the GPU.

Run: ``PYTHONPATH=. python3 benchmarks/bench_overlap.py --json out.json`` (CUDA);
``--device cpu --quick`` runs the tiny geometry in seconds (a smoke test; CPU loads are
synchronous, so its overlap figures mean nothing).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from _common import describe_device, format_table, import_hicache, log, pick_device

engine_mod = import_hicache("engine")
model_mod = import_hicache("model")
radix_mod = import_hicache("radix")

GEOMETRIES: dict[str, dict[str, Any]] = {
    "llama3-8b": dict(vocab_size=32000, num_layers=32, num_heads=32, num_kv_heads=8,
                      head_dim=128, intermediate_size=14336, dtype=torch.bfloat16),
    "tiny": dict(vocab_size=256, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
                 intermediate_size=64, dtype=torch.float32),
}  # fmt: skip
TARGET = 1.05  # host hit <= 1.05 x max(device hit, bare load)
PHASES = ("cold", "dev_busy", "device", "host", "load")


def parse_pairs(text: str) -> list[tuple[int, int]]:
    """``"8k/256,16k/1k"`` -> ``[(8192, 256), (16384, 1024)]``."""

    def size(s: str) -> int:
        s = s.strip().lower()
        return int(s[:-1]) * 1024 if s.endswith("k") else int(s)

    return [(size(p), size(s)) for p, s in (part.split("/") for part in text.split(","))]


@dataclass
class Cell:
    backend: str
    ahead: int | None  # the cache's layers_ahead (None: a load batch issued whole)
    page: int
    prefix: int
    suffix: int
    times: dict[str, list[float]]  # phase -> seconds per repeat
    issue_us: list[float]  # CPU time per layer of issuing the host hit's load batch
    host_cpu_ms: list[float]  # match_prefix + init_load_back CPU time of the host hit
    fwd_cpu_ms: dict[str, list[float]]  # device / host hit: CPU time of the model's forward call
    hits: dict[str, list[int]]  # phase -> tokens served from the expected tier

    @classmethod
    def empty(cls, backend: str, ahead: int | None, page: int, prefix: int, suffix: int) -> Cell:
        return cls(backend, ahead, page, prefix, suffix, {p: [] for p in PHASES}, [], [],
                   {"device": [], "host": []}, {p: [] for p in PHASES})  # fmt: skip

    def median(self, phase: str) -> float:
        return statistics.median(self.times[phase])

    @property
    def overlap(self) -> float:
        d, ld, h = self.median("device"), self.median("load"), self.median("host")
        return (d + ld - h) / min(d, ld)

    def as_dict(self) -> dict[str, Any]:
        med = {f"{p}_ms": self.median(p) * 1e3 for p in PHASES}
        return {
            "backend": self.backend,
            "layers_ahead": self.ahead,
            "page": self.page,
            "prefix": self.prefix,
            "suffix": self.suffix,
            **med,
            "host_over_device": self.median("host") / self.median("device"),
            "busy_over_device": self.median("dev_busy") / self.median("device"),
            "overlap": self.overlap,
            "target_met": self.median("host")
            <= TARGET * max(self.median("device"), self.median("load")),
            "issue_us_per_layer": statistics.median(self.issue_us),
            "host_cpu_ms": statistics.median(self.host_cpu_ms),
            "fwd_cpu_ms": {p: statistics.median(v) for p, v in self.fwd_cpu_ms.items()},
            "samples_ms": {p: [t * 1e3 for t in self.times[p]] for p in PHASES},
            "hits": self.hits,
        }


class Timed:
    """Wraps one of the cache's public methods on the instance, adding its wall time to
    ``seconds`` (reset by the caller)."""

    def __init__(self, obj: Any, name: str) -> None:
        self.seconds = 0.0
        self.obj, self.name = obj, name
        inner = getattr(obj, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        setattr(obj, name, wrapper)

    def close(self) -> None:
        """Unwrap: the class's method again."""
        delattr(self.obj, self.name)


class Bench:
    """One engine (one io_backend and page size) and the measurements on it."""

    def __init__(
        self, model: Any, backend: str, ahead: int | None, page: int, args: argparse.Namespace
    ) -> None:
        longest = max(p + s for p, s in args.pairs)
        # a round holds P + 4 suffixes at most on the device (then everything is evicted)
        tokens = -(-(5 * (longest + 4 * max(s for _, s in args.pairs)) // 4) // page) * page
        hicache = radix_mod.HiCacheConfig(
            hicache_ratio=args.host_ratio, io_backend=backend, layers_ahead=ahead
        )
        spec = engine_mod.CacheSpec("hiradix", tokens, page, longest + 64, 8, hicache=hicache)
        config = engine_mod.EngineConfig(max_prefill_tokens=longest + 64, stall_timeout_s=600.0)
        self.engine = engine_mod.build_engine(model, spec, config)
        self.cache = self.engine.cache
        self.device = model.device
        self.layers = model.cfg.num_layers
        self.vocab = model.cfg.vocab_size
        self.rng = np.random.default_rng(args.seed)
        self.issue = Timed(self.cache, "ready_to_load_host_cache")
        self.match = Timed(self.cache, "match_prefix")
        self.init = Timed(self.cache, "init_load_back")
        self.forward = Timed(model, "forward")  # its CPU time: is the forward launch-bound?
        self.profile = args.profile

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def tokens(self, n: int) -> list[int]:
        return self.rng.integers(0, self.vocab, n).tolist()

    def ttft(self, prompt: list[int]) -> Any:
        req = self.engine.submit(prompt, 1)
        while self.engine.has_work():
            self.engine.step()
        assert req.first_token_time is not None, req.error
        return req

    def quiet(self, to_host: bool) -> None:
        """Let every transfer land; with ``to_host`` also drop every device copy (backed-up
        nodes become host-only)."""
        self.cache.drain_transfers()
        if to_host:
            self.cache.evict(self.cache.evictable_size())
        self.sync()

    def bare_load(self, prefix: list[int]) -> tuple[float, int]:
        key = radix_mod.RadixKey(prefix)
        t0 = time.perf_counter()
        match = self.cache.match_prefix(key)
        device, _ = self.cache.init_load_back(match.last_host_node, match.host_hit_length)
        self.cache.ready_to_load_host_cache()
        self.cache.drain_transfers()  # issues the layers a forward pass would have (layers_ahead)
        self.sync()
        return time.perf_counter() - t0, len(device)

    def run_cell(self, cell: Cell, rounds: range) -> Cell:
        """Fill ``cell`` (its times empty); ``rounds`` numbered 0 warm up (kernels,
        allocator) and are not recorded."""
        prefix_len, suffix_len = cell.prefix, cell.suffix
        for round_ in rounds:
            gc.collect()
            prefix = self.tokens(prefix_len)
            sample: dict[str, float] = {}
            hits: dict[str, int] = {}
            self.quiet(to_host=True)
            lead = int(self.rng.integers(0, self.vocab))  # suffixes differ in their first token
            for j, phase in enumerate(("cold", "dev_busy", "device", "host")):
                if phase == "device":
                    self.quiet(to_host=False)
                if phase == "host":
                    self.quiet(to_host=True)
                    for timer in (self.issue, self.match, self.init):
                        timer.seconds = 0.0
                suffix = [(lead + j) % self.vocab, *self.tokens(suffix_len - 1)]
                self.forward.seconds = 0.0
                profile = self.profile and round_ == rounds[-1] and phase in ("device", "host")
                prof = cProfile.Profile() if profile else None
                req = (
                    self.ttft(prefix + suffix)
                    if prof is None
                    else prof.runcall(self.ttft, prefix + suffix)
                )
                if prof is not None:
                    print(
                        f"--- profile: {cell.backend} ahead {cell.ahead} {prefix_len}/"
                        f"{suffix_len} {phase} hit, {req.first_token_time - req.arrival:.4f} s"
                    )
                    pstats.Stats(prof).sort_stats("cumulative").print_stats("hicache|cuda", 30)
                if phase in ("device", "host"):
                    sample[f"{phase}_fwd"] = self.forward.seconds
                sample[phase] = req.first_token_time - req.arrival
                hits[phase] = req.host_hit if phase == "host" else req.device_hit
            issue, host_cpu = self.issue.seconds, self.match.seconds + self.init.seconds
            self.quiet(to_host=True)
            sample["load"], hits["load"] = self.bare_load(prefix)
            if round_ == 0:
                continue
            for phase in PHASES:
                cell.times[phase].append(sample[phase])
                cell.hits[phase].append(hits[phase])
            cell.issue_us.append(issue / self.layers * 1e6)
            cell.host_cpu_ms.append(host_cpu * 1e3)
            for phase, values in cell.fwd_cpu_ms.items():
                values.append(sample[f"{phase}_fwd"] * 1e3)
        return cell

    def close(self) -> None:
        self.forward.close()
        self.cache.drain_transfers()
        self.cache.reset()
        self.cache.cache_controller.mem_pool_host.close()  # unpin now, not at garbage collection


def build_model(geometry: str, device: torch.device) -> Any:
    cfg = model_mod.ModelConfig(**GEOMETRIES[geometry])
    return model_mod.TinyTransformer(cfg, device)


def table(cells: list[Cell]) -> str:
    header = [
        "backend", "ahead", "page", "prefix/suffix", *PHASES, "host/dev", "busy/dev", "overlap",
        "issue us/layer", "host cpu ms", "fwd cpu dev/host", "target",
    ]  # fmt: skip
    rows = []
    for c in cells:
        d = c.as_dict()
        rows.append([
            c.backend, "all" if c.ahead is None else str(c.ahead), str(c.page),
            f"{c.prefix}/{c.suffix}",
            *(f"{d[f'{p}_ms']:.1f}" for p in PHASES),
            f"{d['host_over_device']:.3f}", f"{d['busy_over_device']:.3f}", f"{d['overlap']:.2f}",
            f"{d['issue_us_per_layer']:.0f}", f"{d['host_cpu_ms']:.2f}",
            f"{d['fwd_cpu_ms']['device']:.1f}/{d['fwd_cpu_ms']['host']:.1f}",
            "ok" if d["target_met"] else "MISS",
        ])  # fmt: skip
    title = "TTFT medians in ms; overlap = (device + load - host) / min(device, load)"
    return format_table(header, rows, f"{title}; target: host <= {TARGET} x max(device, load)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--geometry", choices=sorted(GEOMETRIES), default=None)
    parser.add_argument("--pairs", default=None, help="prefix/suffix pairs, e.g. 8k/256,16k/1k")
    parser.add_argument("--backends", default="kernel,direct")
    parser.add_argument("--pages", default="1,64")
    parser.add_argument(
        "--layers-ahead",
        default="all,2",
        help="the cache's layers_ahead values; all: each load batch issued whole",
    )
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--host-ratio", type=float, default=1.1)  # pinning takes time
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny geometry, short pairs, 2 runs")
    parser.add_argument("--json", default=None, help="write the cells here")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the last round's device and host hits"
    )
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    geometry = args.geometry or ("tiny" if args.quick else "llama3-8b")
    args.pairs = parse_pairs(args.pairs or ("64/16,128/64" if args.quick else
                                            "8k/256,8k/2k,16k/1k,32k/512"))  # fmt: skip
    repeats = args.repeats or (2 if args.quick else 3)
    model = build_model(geometry, device)
    cells: list[Cell] = []
    aheads = [None if a == "all" else int(a) for a in args.layers_ahead.split(",")]
    engines = [(b, a, int(p)) for b in args.backends.split(",") for a in aheads
               for p in args.pages.split(",")]  # fmt: skip
    for backend, ahead, page in engines:
        t0 = time.perf_counter()
        bench = Bench(model, backend, ahead, page, args)
        log(f"{backend} ahead {ahead} page {page}: engine built in "
                f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
        bench_cells: list[Cell] = []
        for prefix, suffix in args.pairs:
            first = not bench_cells  # the engine's first cell warms it up
            rounds = range(0 if first else 1, repeats + 1)
            gc.disable()  # no collection pauses inside a timed request (one per round)
            try:
                cell = bench.run_cell(Cell.empty(backend, ahead, page, prefix, suffix), rounds)
            finally:
                gc.enable()
            bench_cells.append(cell)
            cells.append(cell)
            log(table([cell]).splitlines()[-1])
        bench.close()
        del bench
        gc.collect()
    if args.json:
        report = {
            "geometry": geometry,
            "repeats": repeats,
            **describe_device(device),
            "cells": [c.as_dict() for c in cells],
        }
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(table(cells))


if __name__ == "__main__":
    main()
