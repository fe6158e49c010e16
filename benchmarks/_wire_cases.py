"""Issue 15's cases of the transfer benchmark: loads from large pools, and ``io_backend="auto"``.

- *Large pools*: a serving pool is mostly not being moved, so a batch's slots are drawn from a
  pool several times its size (``--large-pool-factor``, both sides). The per-layer kernel loads
  run again on such pools; their rows are labelled ``... pool xN``.
- *auto*: the backend :func:`hicache.pools.auto_backend.resolve` picks for the index set (on its
  CPU copies, as the controller decides once per batch), then that op, as its own row
  (``auto (layer_first)``). Its target compares *effective* GB/s, bytes over the larger of the GPU
  time and the wall time of calls issued back to back (a copy-engine op the CPU cannot keep busy
  is as slow as its issue), with the better of the kernel and the direct row of the same cell.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

from _kv_buffers import Pools, Shape
from _report import AUTO_TARGET, MIN_TARGET_ITEM, Row
from _transfer_cases import OpSpec, spec

LARGE_POOL_OPS = (("per_layer", "load"), ("per_layer_pf_lf", "load"))
AUTO_PAIRS = {"load": ("per_layer", "direct"), "backup": ("all_layer", "direct")}


def large_pool_shape(shape: Shape, factor: int) -> Shape | None:
    """``shape`` on pools ``factor`` times the transfer, where a load target applies."""
    if factor <= shape.pool_factor or shape.item < MIN_TARGET_ITEM:
        return None
    return dataclasses.replace(shape, pool_factor=factor)


def large_pool_specs() -> list[OpSpec]:
    return [spec(op, kind) for op, kind in LARGE_POOL_OPS]


def auto_choice(auto_backend: ModuleType, pools: Pools, kind: str) -> OpSpec:
    """The op ``io_backend="auto"`` runs for ``pools``' first index set (layer_first)."""
    ix, s = pools.sets[0], pools.shape
    backend = auto_backend.resolve("auto", "layer_first", ix.far_cpu, ix.near_cpu, s.item)
    kernel_op, direct_op = AUTO_PAIRS[kind]
    return spec(kernel_op if backend == "kernel" else direct_op, kind)


def effective_gbps(row: Row) -> float | None:
    """Bytes over the larger of GPU time and back-to-back wall time per call."""
    if not row.gbps:
        return None
    gpu_s = row.nbytes / (row.gbps * 1e9)
    wall_s = max(gpu_s, (row.sustained_us or 0.0) * 1e-6)
    return row.nbytes / wall_s / 1e9


def judge_auto(rows: list[Row]) -> None:
    """Give every auto row its target: effective GB/s >= AUTO_TARGET x the better of the
    kernel and direct rows (layer_first) of its section, column and kind."""
    for row in rows:
        if not row.label.startswith("auto"):
            continue
        kernel_op, direct_op = AUTO_PAIRS[row.kind]
        names = {"transfer_kv_" + kernel_op, "transfer_kv_" + direct_op}
        peers = [
            effective_gbps(r)
            for r in rows
            if r.op in names
            and r.layout == "layer_first"
            and (r.section, r.column, r.kind) == (row.section, row.column, row.kind)
        ]
        best = max((p for p in peers if p), default=None)
        mine = effective_gbps(row)
        value = mine / best if mine and best else None
        row.target = {
            "metric": "vs_best",
            "value": value,
            "threshold": AUTO_TARGET,
            "passed": value is not None and value >= AUTO_TARGET,
        }
