"""Achieved GB/s of every transfer op on scattered token slots, next to a contiguous copy.

Sections (``--sections``, run in this order; the table is printed last):
  sm     matmul slowdown with a concurrent transfer (bench_sm_cost.py)
  bidir  a per-layer load of all layers and an all-layer backup at once, on two streams,
         total GB/s vs an H2D and a D2H contiguous copy at once
  h2d    per-layer H2D loads and all-layer D2H backups, every op and io_backend, vs a
         contiguous pinned ``copy_`` of the same bytes in the same direction
  d2d    the same ops with both sides on the GPU, ``--d2d-block-quota`` (default: SM count),
         vs a D2D copy

Slots are random whole pages (page size 1: random slots), a fresh permutation per index set;
calls rotate index sets and layers. ``--budget-s`` skips the remaining cases once spent.

    python3 benchmarks/bench_transfer.py                  # default grid, < 4 min on an H200
    python3 benchmarks/bench_transfer.py --quick          # smoke run (CPU: reference ops)
    python3 benchmarks/bench_transfer.py --full           # every item x page x tokens
    python3 benchmarks/bench_transfer.py --block-quota 1,2,4,8 --num-warps 8,16,32 --sections h2d
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch
from _common import (
    KIB,
    Clock,
    describe_device,
    import_hicache,
    log,
    pick_device,
)
from _kv_buffers import Arenas, Pools, Shape
from _report import Row, judge, render_rows, render_sm_cost, render_targets, target_summary
from _transfer_args import build_grid, fit_memory, host_bytes, parse_args
from _transfer_cases import SPECS, OpSpec, bind, direct_tokens, spec
from _wire_cases import auto_choice, judge_auto, large_pool_shape, large_pool_specs
from bench_sm_cost import DIRECT_TRANSFERS, NO_KNOBS, sm_cost

START = time.monotonic()
SECTIONS = {"sm", "bidir", "h2d", "d2d"}
BIDIR_PAIRS = (
    ("per_layer", "all_layer"),
    ("per_layer_pf_lf", "all_layer_lf_pf"),
    ("per_layer_ph_lf", "all_layer_lf_ph"),
    ("direct", "direct"),
)


def _block(arena: torch.Tensor, i: int, nbytes: int, from_end: bool) -> torch.Tensor:
    """The ``i``-th ``nbytes`` slice of ``arena``, counted from its start or its end."""
    lo = arena.numel() - (i + 1) * nbytes if from_end else i * nbytes
    return arena[lo : lo + nbytes]


class Runner:
    """Runs cases, caches the contiguous references, keeps the rows and the time budget."""

    def __init__(self, args: argparse.Namespace, device: torch.device, shapes: list[Shape]):
        self.args, self.device = args, device
        self.clock = Clock(
            device, warmup=args.warmup, samples=args.samples, min_sample_s=args.min_sample_ms / 1e3
        )
        self.kernels = import_hicache("kernels")
        self.devices = import_hicache("devices")
        big = [b for s in shapes if (b := large_pool_shape(s, args.large_pool_factor))]
        self.arenas = Arenas(shapes + big, device, "d2d" in args.sections, args.arena)
        self.auto_backend = import_hicache("pools.auto_backend")
        self.refs: dict[tuple[str, int], float] = {}
        self.rows: list[Row] = []
        self.errors: list[str] = []  # failures outside a row (the SM cost section)
        budget = args.budget_s or (540.0 if args.full else 200.0)
        self.deadline = START + budget
        self.sm_count = (
            torch.cuda.get_device_properties(device).multi_processor_count
            if device.type == "cuda"
            else 2
        )

    def knobs(self, d2d: bool) -> list[dict]:
        quotas = [self.args.d2d_block_quota or self.sm_count] if d2d else self.args.block_quota
        return [
            {"block_quota": q, "num_warps_per_block": w}
            for q in quotas
            for w in self.args.num_warps
        ]

    def _copy(self, direction: str, nbytes: int) -> Callable[[int], None]:
        """Contiguous copy of ``nbytes``; call ``k`` uses block ``k % 8`` of the arenas (where
        they hold 8), so small D2D copies do not run from L2 while the ops rotate over layers.
        D2H blocks count from the arenas' ends, apart from the H2D ones."""
        a = self.arenas
        src, dst = {"h2d": (a.far, a.near), "d2h": (a.near, a.far), "d2d": (a.far_dev, a.near)}[
            direction
        ]
        assert src is not None, "D2D copies need the far_dev arena"
        blocks = max(1, min(8, src.numel() // nbytes, dst.numel() // nbytes))
        tail = direction == "d2h"
        pairs = [
            (_block(src, i, nbytes, tail), _block(dst, i, nbytes, tail)) for i in range(blocks)
        ]
        return lambda k: pairs[k % blocks][1].copy_(pairs[k % blocks][0], non_blocking=True)

    def _concurrent(self, fns: list[Callable[[int], None]]) -> Callable[[int], None]:
        """``fn(k)`` running each of ``fns`` on its own stream, joined back to the current one."""
        dev = self.devices
        streams = [dev.new_stream(self.device) for _ in fns]

        def run(k: int) -> None:
            cur = dev.current_stream(self.device)
            for fn, s in zip(fns, streams, strict=True):
                if s is not None:
                    s.wait_stream(cur)
                with dev.stream_scope(s):
                    fn(k)
            for s in streams:
                if s is not None:
                    cur.wait_stream(s)

        return run

    def ref_gbps(self, direction: str, nbytes: int) -> float:
        """GB/s of a contiguous copy of ``nbytes`` (``both``: an H2D and a D2H copy at once)."""
        key = (direction, nbytes)
        if key not in self.refs:
            fn = (
                self._concurrent([self._copy("h2d", nbytes // 2), self._copy("d2h", nbytes // 2)])
                if direction == "both"
                else self._copy(direction, nbytes)
            )
            self.refs[key] = nbytes / self.clock.measure(fn).median_s / 1e9
        return self.refs[key]

    def measure(self, row: Row, fn: Callable[[int], None], direction: str) -> None:
        """Fill ``row`` with the GB/s of ``fn`` and of its reference; errors become a note.

        Every op is timed on the GPU alone; ``row.sustained_us`` is the wall time per call of
        calls issued back to back, and a cell is marked CPU-bound when that is over 1.15x the GPU
        time (the CPU cannot issue calls as fast as the GPU runs them).
        """
        if time.monotonic() > self.deadline:
            row.note = "skipped: time budget"
        else:
            try:
                t = self.clock.measure(fn)
                row.gbps, row.cpu_us = row.nbytes / t.median_s / 1e9, t.cpu_s * 1e6
                row.sustained_us = t.sustained_s * 1e6
                row.ref_gbps = self.ref_gbps(direction, row.nbytes)
            except Exception as e:  # one broken op must not hide the others' numbers
                row.gbps, row.note = None, f"{type(e).__name__}: {e}"[:300]
        judge(row)
        self.rows.append(row)

    def _row(
        self, section: str, sp: OpSpec, pools: Pools, knobs: dict, tokens: int, nbytes: int, **kw
    ) -> Row:
        s = pools.shape
        bq, nw = (None, None) if sp.direct else (knobs["block_quota"], knobs["num_warps_per_block"])
        fields = dict(label=sp.label, op=sp.op, kind=sp.kind, layout=sp.layout)
        fields.update(kw)
        return Row(
            section,
            item=s.item,
            page_size=s.page_size,
            tokens=s.tokens,
            moved_tokens=tokens,
            layers=s.layers,
            block_quota=bq,
            num_warps=nw,
            nbytes=nbytes,
            **fields,
        )

    def _pools(self, shape: Shape, d2d: bool) -> Pools:
        sort = self.args.order == "sorted"
        return self.arenas.pools(shape, d2d=d2d, n_sets=self.args.sets, sort=sort)

    def _wanted(self, label: str) -> bool:
        return not self.args.ops or label in self.args.ops.split(",")

    def run_ops(self, shape: Shape, d2d: bool) -> None:
        section = "d2d" if d2d else "h2d/d2h"
        pools = self._pools(shape, d2d)
        for i, knobs in enumerate(self.knobs(d2d)):
            cases = [(sp, sp.label) for sp in SPECS if self._wanted(sp.label)]
            if not d2d:  # io_backend="auto": the op it picks for this shape, as its own row
                auto = [
                    (auto_choice(self.auto_backend, pools, k), "auto (layer_first)")
                    for k in ("load", "backup")
                ]
                cases += [c for c in auto if self._wanted(c[1])]
            for sp, label in cases:
                if sp.direct and (i > 0 or d2d):
                    continue  # no knobs: once is enough; and direct is a host<->device path
                self._one(section, sp, pools, knobs, label)

    def _one(self, section: str, sp: OpSpec, pools: Pools, knobs: dict, label: str) -> None:
        shape = pools.shape
        tokens = direct_tokens(sp, shape, self.args.direct_max_copies)
        row = self._row(
            section, sp, pools, knobs, tokens, sp.bytes_moved(shape, tokens), label=label
        )
        direction = "d2d" if section == "d2d" else {"load": "h2d", "backup": "d2h"}[sp.kind]
        self.measure(row, bind(self.kernels, sp, pools, tokens, knobs), direction)

    def run_large_pool(self, shape: Shape) -> None:
        """The per-layer kernel loads with slots from pools ``--large-pool-factor`` x larger."""
        big = large_pool_shape(shape, self.args.large_pool_factor)
        if big is None:
            return
        pools = self._pools(big, d2d=False)
        for knobs in self.knobs(d2d=False):
            for sp in large_pool_specs():
                label = f"{sp.label} pool x{big.pool_factor}"
                if self._wanted(sp.label) or self._wanted(label):
                    self._one("h2d/d2h", sp, pools, knobs, label)

    def sm_cost(self, shapes: list[Shape]) -> list[dict]:
        """Kernel ops at 2 KiB / page 1, then direct ops (copy engines) at 2 KiB / page 64."""
        out: list[dict] = []
        cases = [
            ((2 * KIB, 1), self.knobs(d2d=False), None),
            ((2 * KIB, 64), [NO_KNOBS], DIRECT_TRANSFERS),
        ]
        for (item, page), knobs, transfers in cases:
            shape = next((s for s in shapes if (s.item, s.page_size) == (item, page)), None)
            if shape is None:
                continue
            pools = self.arenas.pools(shape, d2d=False, n_sets=self.args.sets)
            try:
                out += sm_cost(self.clock, self.kernels, pools, knobs, transfers=transfers)
            except Exception as e:  # report it with the other errors; the tables still come
                self.errors.append(f"sm-cost: {type(e).__name__}: {e}"[:300])
        return out

    def run_bidir(self, shape: Shape) -> None:
        pools = self.arenas.pools(shape, d2d=False, n_sets=self.args.sets)
        L, T = shape.layers, shape.tokens
        for knobs in self.knobs(d2d=False):
            for load_op, backup_op in BIDIR_PAIRS:
                load, backup = spec(load_op, "load"), spec(backup_op, "backup")
                if load.direct and shape.page_size == 1:
                    continue  # one engine copy per token: CPU-bound, not a case anyone runs
                one_load = bind(self.kernels, load, pools, T, knobs)
                fns = [
                    lambda k, f=one_load: [f(k * L + i) for i in range(L)],
                    bind(self.kernels, backup, pools, T, knobs),
                ]
                nbytes = 2 * backup.bytes_moved(shape, T)
                row = self._row(
                    "bidir",
                    load,
                    pools,
                    knobs,
                    T,
                    nbytes,
                    kind="both",
                    label=f"{load.label} + {backup.label}",
                    op=f"{load.op}+{backup.op}",
                )
                self.measure(row, self._concurrent(fns), "both")


def _arena_bytes(shapes: list[Shape], args: argparse.Namespace, device: torch.device) -> int:
    """Host RAM of the arenas ``Runner`` allocates for ``shapes`` (their large pools too)."""
    big = [b for s in shapes if (b := large_pool_shape(s, args.large_pool_factor))]
    return host_bytes(shapes + big, device, "d2d" in args.sections)


def run(args: argparse.Namespace) -> dict:
    device = pick_device(args.device)
    if device.type == "cuda":  # as the controller's transfer streams: the engine batch call
        torch.cuda.set_stream(torch.cuda.Stream(device))  # rejects the legacy default stream
    shapes = build_grid(args, device)
    if not shapes:
        raise SystemExit("empty grid: check --items/--tokens/--page-sizes/--max-layer-mib")
    sections = set(args.sections.split(","))
    if not sections <= SECTIONS:
        raise SystemExit(f"--sections: unknown {sorted(sections - SECTIONS)}; use {SECTIONS}")
    fitting = fit_memory(shapes, lambda kept: _arena_bytes(kept, args, device))
    if len(fitting) < len(shapes):
        log(f"{len(shapes) - len(fitting)} of {len(shapes)} configs left out: RAM available")
    runner = Runner(args, device, fitting)
    sizes = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in runner.arenas.nbytes.items())
    log(f"[{time.monotonic() - START:5.1f}s] {len(shapes)} configs; arenas: {sizes}")
    sm: list[dict] = []
    if "sm" in sections:
        sm = runner.sm_cost(fitting)
    for shape in fitting:
        if "bidir" in sections and shape.item in args.bidir_items:
            runner.run_bidir(shape)
    for shape in fitting:
        log(
            f"[{time.monotonic() - START:5.1f}s] item={shape.item} page={shape.page_size} "
            f"tokens={shape.tokens}"
        )
        for d2d in [False] * ("h2d" in sections) + [True] * ("d2d" in sections):
            runner.run_ops(shape, d2d)
        if "h2d" in sections:
            runner.run_large_pool(shape)
    judge_auto(runner.rows)
    return {
        "rows": runner.rows,
        "sm_cost": sm,
        "errors": runner.errors,
        "device": describe_device(device),
    }


def report(args: argparse.Namespace, result: dict) -> int:
    """Print the tables and write the JSON; the number of distinct errors."""
    rows: list[Row] = result["rows"]
    summary = target_summary(rows, result["sm_cost"])
    doc = {
        "meta": {
            **result["device"],
            "argv": sys.argv[1:],
            "elapsed_s": time.monotonic() - START,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        },
        "rows": [{**dataclasses.asdict(r), "ratio": r.ratio} for r in rows],
        "sm_cost": result["sm_cost"],
        "errors": result["errors"],
        "targets": summary,
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    errors = result["errors"] + list(
        dict.fromkeys(
            f"{r.op}: {r.note}" for r in rows if r.note and not r.note.startswith("skipped")
        )
    )
    skipped = sum(bool(r.note and r.note.startswith("skipped")) for r in rows)
    print(f"\n{result['device']}  elapsed {doc['meta']['elapsed_s']:.0f}s  json: {path}")
    print(f"{len(errors)} distinct errors, {skipped} cases skipped (time budget)")
    for e in errors[:5]:
        print("  ERR", e[:200])
    print(
        "cell = GB/s (GPU time) and ratio vs a contiguous copy of the same bytes; ! misses its"
        " target;\nc: CPU-bound (back to back, a call takes > 1.15x its GPU time: sustained_us in"
        " JSON)."
        f" Direct ops: <= {args.direct_max_copies} copies per call (fewer tokens: moved_tokens"
        " in JSON).\n"
    )
    print(render_rows(rows))
    if result["sm_cost"]:
        print("\n" + render_sm_cost(result["sm_cost"]))
    on_gpu = result["device"]["device"] != "cpu"
    if not on_gpu:
        print("\n(CPU smoke run: reference ops vs a CPU copy; the targets are for the H200)")
    print("\n" + render_targets(summary, judged=on_gpu))
    return len(errors)


def main() -> int:
    """Exit status 1 when an op failed (an error above); a missed speed target is not one."""
    args = parse_args(__doc__.split("\n")[0])
    return 1 if report(args, run(args)) else 0


if __name__ == "__main__":
    sys.exit(main())
