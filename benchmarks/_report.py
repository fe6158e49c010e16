"""Result rows of the transfer benchmark, the issue's targets, and the compact text report.

The report is pivoted: one block per (section, block_quota, num_warps), one line per op, one
column per configuration ``item/page_size/tokens``; a cell is ``GB/s ratio`` where the ratio is
against the contiguous copy of the same bytes in the same direction, and ``!`` marks a cell that
misses its target.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from _common import fmt_size, format_table

RATIO_TARGET = 0.95  # scattered kernel backup vs contiguous pinned copy, block_quota=2 (issue 6)
LOAD_TARGET = 0.90  # scattered per-layer kernel load vs contiguous pinned copy (issue 15)
AUTO_TARGET = 0.97  # io_backend="auto" vs the better of kernel and direct, effective GB/s
BIDIR_TARGET_GBPS = 90.0  # a load and a backup at once, total
D2D_TARGET = 0.7  # device-to-device kernel ops vs a D2D copy, grid-filling block_quota
SLOWDOWN_TARGET_PCT = 3.0  # concurrent matmul slowdown at block_quota=2
TARGET_OPS = {
    ("load", "transfer_kv_per_layer"),
    ("load", "transfer_kv_per_layer_pf_lf"),
    ("load", "transfer_kv_per_layer_ph_lf"),
    ("backup", "transfer_kv_all_layer"),
    ("backup", "transfer_kv_all_layer_lf_pf"),
}
BIDIR_TARGET_LAYOUTS = {"layer_first", "page_first"}
MIN_TARGET_ITEM = 1024
# Direct ops run on the copy engines, which reach the line rate on copies of >= 64 KiB (a few GB/s
# on 2 KiB ones): the same targets apply to them where one page run of one layer is that long.
ENGINE_MIN_RUN = 64 * 1024


@dataclass
class Row:
    """One measurement; ``gbps``/``ref_gbps`` are None when skipped or failed."""

    section: str  # "h2d/d2h", "d2d" or "bidir"
    label: str
    op: str
    kind: str  # "load", "backup" or "both"
    layout: str
    item: int
    page_size: int
    tokens: int  # of the configuration (the column)
    moved_tokens: int  # what the op moved: fewer for direct ops with many copies
    layers: int
    block_quota: int | None
    num_warps: int | None
    nbytes: int
    gbps: float | None = None
    ref_gbps: float | None = None
    cpu_us: float | None = None  # CPU time of one call
    sustained_us: float | None = None  # wall time per call, issued back to back without a gate
    note: str | None = None  # "skipped: ..." or the error
    target: dict = field(default_factory=dict)  # {"metric", "threshold", "passed"}

    @property
    def ratio(self) -> float | None:
        return self.gbps / self.ref_gbps if self.gbps and self.ref_gbps else None

    @property
    def column(self) -> str:
        return f"{fmt_size(self.item)}/{self.page_size}/{fmt_count(self.tokens)}"


def fmt_count(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def judge(row: Row) -> None:
    """Attach the target that applies to ``row`` (at block_quota=2; D2D at any quota).

    A failed or skipped row under a target fails it. Direct ops: only where a page run of one
    layer holds ``ENGINE_MIN_RUN`` bytes."""
    direct = "direct" in row.op
    if row.item < MIN_TARGET_ITEM or (direct and row.item * row.page_size < ENGINE_MIN_RUN):
        return
    quota_ok = direct or row.block_quota == 2
    if row.section == "h2d/d2h" and quota_ok and (direct or (row.kind, row.op) in TARGET_OPS):
        metric, value = "ratio", row.ratio
        threshold = LOAD_TARGET if row.kind == "load" and not direct else RATIO_TARGET
    elif row.section == "bidir" and quota_ok and row.layout in BIDIR_TARGET_LAYOUTS:
        metric, value, threshold = "gbps", row.gbps, BIDIR_TARGET_GBPS
    elif row.section == "d2d":
        metric, value, threshold = "ratio", row.ratio, D2D_TARGET
    else:
        return
    row.target = {
        "metric": metric,
        "value": value,
        "threshold": threshold,
        "passed": value is not None and value >= threshold,
    }


def _cell(row: Row | None) -> str:
    if row is None:
        return ""
    if row.gbps is None:
        return "ERR" if row.note and not row.note.startswith("skipped") else "skip"
    ratio = f"{row.ratio:.2f}".removeprefix("0") if row.ratio else "-"
    flag = "!" if row.target and not row.target["passed"] else ""
    if row.sustained_us is not None and row.sustained_us * 1e-6 > 1.15 * row.nbytes / (
        row.gbps * 1e9
    ):
        flag += "c"
    return f"{row.gbps:.1f} {ratio}{flag}"


def _pivot(rows: list[Row], title: str, ref_labels: dict[str, str]) -> str:
    cols = sorted({(r.item, r.page_size, r.tokens): r.column for r in rows}.items())
    names = [c for _, c in cols]
    lines: dict[str, dict[str, Row]] = {}
    for r in rows:
        lines.setdefault(f"{r.kind:6s} {r.label}", {})[r.column] = r
    table = []
    for kind, ref_label in ref_labels.items():
        refs: dict[str, Row] = {}  # per column, the reference of the op moving the most bytes
        for r in sorted((r for r in rows if r.kind == kind and r.ref_gbps), key=lambda r: r.nbytes):
            refs[r.column] = r
        table.append([ref_label] + [f"{refs[c].ref_gbps:.1f}" if c in refs else "" for c in names])
        table += [
            [k] + [_cell(v.get(c)) for c in names] for k, v in lines.items() if k.startswith(kind)
        ]
    return format_table(["op  (cell: GB/s ratio)", *names], table, title)


def _blocks(rows: list[Row]) -> Iterable[tuple[tuple, list[Row]]]:
    """Rows grouped by (section, block_quota, num_warps); direct ops (no knobs) join the first."""
    keys: dict[tuple, list[Row]] = {}
    for section in dict.fromkeys(r.section for r in rows):
        part = [r for r in rows if r.section == section]
        knobs = sorted({(r.block_quota, r.num_warps) for r in part if r.block_quota is not None})
        first = knobs[0] if knobs else (None, None)
        for r in part:
            knob = (r.block_quota, r.num_warps) if r.block_quota is not None else first
            keys.setdefault((section, *knob), []).append(r)
    return keys.items()


REFS = {
    "h2d/d2h": {"load": "copy H2D (contiguous)", "backup": "copy D2H (contiguous)"},
    "d2d": {"load": "copy D2D (contiguous)", "backup": "copy D2D (contiguous)"},
    "bidir": {"both": "copies H2D+D2H at once"},
}


def render_rows(rows: list[Row]) -> str:
    """The pivot blocks; columns are item bytes / page size / tokens."""
    out = []
    order = list(REFS)
    for (section, bq, nw), block in sorted(_blocks(rows), key=lambda kv: order.index(kv[0][0])):
        title = f"== {section}: block_quota={bq} num_warps={nw} (columns: item/page/tokens) =="
        out.append(_pivot(block, title, REFS[section]))
    return "\n\n".join(out)


def render_sm_cost(results: list[dict]) -> str:
    header = [
        "transfer",
        "bq",
        "nw",
        "mm alone ms",
        "mm with ms",
        "slowdown",
        "xfer GB/s alone",
        "xfer GB/s overlapped",
        "verdict",
    ]
    body = [
        [
            r["transfer"],
            str(r["block_quota"]),
            str(r["num_warps_per_block"]),
            f"{r['mm_alone_ms']:.2f}",
            f"{r['mm_with_ms']:.2f}",
            f"{r['slowdown_pct']:+.2f}%",
            *(
                ["-", "-"]
                if r["op"] == "none"
                else [f"{r['xfer_alone_gbps']:.1f}", f"{r['xfer_overlap_gbps']:.1f}"]
            ),
            _verdict(r.get("target")),
        ]
        for r in results
    ]
    return format_table(header, body, "== SM cost: bf16 matmul loop alone vs with a transfer ==")


def _verdict(target: dict | None) -> str:
    return "" if not target else ("PASS" if target["passed"] else "FAIL")


def target_summary(rows: list[Row], sm_cost: list[dict]) -> list[dict]:
    """Worst case per target group, for the final PASS/FAIL lines."""
    groups: dict[str, list[tuple[float, str, bool]]] = {}
    for r in rows:
        if r.target:
            value = r.target["value"]
            name = {
                "h2d/d2h": f"{r.kind} {r.label}",
                "d2d": "d2d kernel ops",
                "bidir": "load+backup at once" + (" (direct)" if "direct" in r.op else ""),
            }[r.section]
            desc = {
                "h2d/d2h": r.column,
                "d2d": f"{r.column} {r.kind} {r.label}",
                "bidir": f"{r.column} {r.layout}",
            }[r.section]
            threshold = r.target["threshold"]
            unit = {"gbps": "GB/s", "vs_best": "x best"}.get(r.target["metric"], "x copy")
            entry = (value or 0.0, desc, r.target["passed"], threshold, unit)
            groups.setdefault(name, []).append(entry)
    out = []
    for name, vals in groups.items():
        value, where, _, threshold, metric = min(vals)
        out.append(
            {
                "target": name,
                "worst": value,
                "at": where,
                "threshold": threshold,
                "unit": metric,
                "passed": all(v[2] for v in vals),
            }
        )
    for r in sm_cost:
        if r.get("target"):
            out.append(
                {
                    "target": f"matmul slowdown ({r['transfer']})",
                    "worst": r["slowdown_pct"],
                    "at": f"bq={r['block_quota']}",
                    "threshold": SLOWDOWN_TARGET_PCT,
                    "unit": "% (<=)",
                    "passed": r["target"]["passed"],
                }
            )
    return out


def render_targets(summary: list[dict], judged: bool = True) -> str:
    """The target table; ``judged`` False (a CPU run against the H200's targets): no verdicts."""
    body = [
        [
            t["target"],
            f"{t['worst']:.2f} {t['unit']}",
            t["at"],
            f"{t['threshold']:g}",
            ("PASS" if t["passed"] else "FAIL") if judged else "n/a (CPU)",
        ]
        for t in summary
    ]
    head = [
        "target (items >= 1K, block_quota=2; direct: page runs >= 64K)",
        "worst",
        "at",
        "need",
        "verdict",
    ]
    passed = sum(t["passed"] for t in summary)
    return format_table(head, body, f"== TARGETS: {passed}/{len(summary)} pass ==")
