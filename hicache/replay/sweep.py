"""``--sweep NAME=V1,V2,...[,NAME=V1,...]``: one replay per point of the grid of the values
given, for hit rate per tier against capacity and tiering.

Names are the flags' (``device-tokens``, ``host-ratio``, ``storage-capacity``, ``tiering``,
``storage-tiering``, and for hybrid models ``layers-pattern`` (it sets the layer count),
``state-slots``, ``checkpoint``; ``_`` may stand for ``-``). A comma-separated item with
``=`` starts a name, the items after it are more of its values:
``device-tokens=8192,16384,tiering=inclusive,exclusive`` is 2 x 2 replays. Numbers are sorted
ascending, words keep their order; the grid runs in the order the names were given, the last
name changing fastest, so rows that differ only by the last name (e.g. ``tiering``) are
adjacent in the table.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from hicache.controller import TIERINGS
from hicache.replay.config import ReplayConfig
from hicache.replay.cost import CostModel
from hicache.replay.runner import cost_model

Grid = dict[str, list[Any]]  # flag name -> its values


def _word(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(text)
        return text

    parse.__name__ = " or ".join(choices)
    return parse


SWEEPABLE: dict[str, tuple[str, Callable[[str], Any]]] = {  # flag: (ReplayConfig field, parse)
    "device-tokens": ("device_tokens", int),
    "host-ratio": ("host_ratio", float),
    "storage-capacity": ("storage_capacity", int),
    "tiering": ("tiering", _word(TIERINGS)),
    "storage-tiering": ("storage_tiering", _word(TIERINGS)),
    "layers-pattern": ("layers_pattern", str),
    "state-slots": ("state_slots", int),
    "checkpoint": ("checkpoint", str),
}


def _values(name: str, items: list[str]) -> list[Any]:
    parse = SWEEPABLE[name][1]
    try:
        parsed = [parse(v.strip()) for v in items if v.strip()]
    except ValueError:
        kind = getattr(parse, "__name__", "values")
        raise ValueError(
            f"--sweep {name}: values must be {kind}, got {','.join(items)!r}"
        ) from None
    if not parsed:
        raise ValueError(f"--sweep {name}: give at least one value")
    unique = list(dict.fromkeys(parsed))
    return sorted(unique) if parse in (int, float) else unique


def parse_sweep(text: str) -> Grid:
    """``"device-tokens=1024,4096,tiering=inclusive"`` -> ``{"device-tokens": [1024, 4096],
    "tiering": ["inclusive"]}``; ``ValueError`` naming ``--sweep`` for an unknown or repeated
    name, a value before the first name, or a bad value."""
    groups: dict[str, list[str]] = {}
    current: list[str] | None = None
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if sep:
            name = name.strip().replace("_", "-")
            if name not in SWEEPABLE:
                raise ValueError(f"--sweep names must be in {sorted(SWEEPABLE)}, got {text!r}")
            if name in groups:
                raise ValueError(f"--sweep {name}: given twice in {text!r}")
            current = groups[name] = [value]
        elif current is None:
            raise ValueError(f"--sweep must start with NAME=V1,V2,..., got {text!r}")
        else:
            current.append(item)
    return {name: _values(name, items) for name, items in groups.items()}


def grid_points(grid: Grid) -> list[dict[str, Any]]:
    """Every combination of the grid's values, as ``{flag name: value}``, last name fastest."""
    names = list(grid)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*grid.values())]


def sweep_configs(base: ReplayConfig, points: list[dict[str, Any]]) -> list[ReplayConfig]:
    """One validated config per point (all checked before any replay starts)."""
    return [base.with_(**_changes(point)) for point in points]


def _changes(point: dict[str, Any]) -> dict[str, Any]:
    """The ``ReplayConfig`` fields of ``point``; a layer pattern sets the layer count."""
    changes = {SWEEPABLE[k][0]: v for k, v in point.items()}
    if "layers_pattern" in changes:
        changes["layers"] = len(changes["layers_pattern"])
    return changes


def total_capacity(cfg: ReplayConfig) -> int | None:
    """Device + host + storage tokens (None when storage is uncapped)."""
    if cfg.storage != "none" and cfg.storage_capacity is None:
        return None
    host = cfg.host_tokens if cfg.host_ratio else 0
    return cfg.device_slots + host + (cfg.storage_capacity or 0)


COLUMNS = ("capacity", "device %", "host %", "storage %", "total %", "ideal %", "TTFT p50 ms")
# with a recurrent model among the points: checkpoints taken, peak states held, their GB
STATE_COLUMNS = ("checkpoints", "dev states", "host states", "state GB")


def _cells(names: list[str], cells: list[str]) -> str:
    """One table line: the swept names' cells, then ``COLUMNS``' and maybe ``STATE_COLUMNS``'
    (right-aligned)."""
    columns = COLUMNS + STATE_COLUMNS[: len(cells) - len(names) - len(COLUMNS)]
    widths = [max(len(n), 10) for n in names] + [max(len(c), 9) for c in columns]
    return "  " + "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))


def sweep_header(grid: Grid, states: bool = False) -> str:
    """The table's header; ``states``: with ``STATE_COLUMNS`` (``has_states``)."""
    return _cells(list(grid), [*grid, *COLUMNS, *(STATE_COLUMNS if states else ())])


def has_states(configs: list[ReplayConfig]) -> bool:
    """Whether a point's model has linear layers (the table gets ``STATE_COLUMNS``)."""
    return any("L" in (c.layers_pattern or "") for c in configs)


def _state_cells(summary: dict[str, Any]) -> list[str]:
    """Checkpoints, peak states held on device and host, their GB at peak (``-``: none)."""
    s = summary["states"]
    if s is None:
        return ["-"] * len(STATE_COLUMNS)
    gb = (s["device"]["peak_bytes"] + s["host"]["peak_bytes"]) / 1e9
    peaks = [s["device"]["held_peak"], s["host"]["held_peak"]]
    return [f"{s['checkpoints']:,}", *(f"{p:,}" for p in peaks), f"{gb:,.2f}"]


def sweep_row(
    point: dict[str, Any], cfg: ReplayConfig, summary: dict[str, Any], states: bool = False
) -> str:
    """One row of the sweep's table: the point, total capacity (tokens), hit rate per tier,
    the reachable ideal, TTFT p50; ``states``: then ``_state_cells``."""
    h, total, p50 = summary["hit_rate"], total_capacity(cfg), summary["ttft_ms"]["p50"]
    rates = [f"{h[k]:.1f}" for k in ("device", "host", "storage", "total", "ideal")]
    cap = f"{total:,}" if total is not None else "uncapped"
    extra = _state_cells(summary) if states else []
    cells = [*map(str, point.values()), cap, *rates, f"{p50 or 0:,.0f}", *extra]
    return _cells(list(point), cells) + (" (queue-bound)" if summary["queueing_dominates"] else "")


def sweep_cost(configs: list[ReplayConfig]) -> CostModel:
    """One clock for every point of a sweep: the bandwidth measured once (on the first config
    with a host tier; they differ only in capacities, not in what a copy costs) or the flags'."""
    with_host = [c for c in configs if c.host_ratio > 0]
    return cost_model(with_host[0] if with_host else configs[0])


def describe_bandwidth(cost: CostModel) -> str:
    """``"h2d 12.3 GB/s, d2h 11.0 GB/s (measured)"`` (or ``(flags)``); ``"none (no host
    tier)"`` when no point has one."""
    if not cost.h2d_bytes_per_s:
        return "none (no host tier)"
    how = "measured" if cost.measured else "flags"
    h2d, d2h = cost.h2d_bytes_per_s / 1e9, cost.d2h_bytes_per_s / 1e9
    return f"h2d {h2d:.3g} GB/s, d2h {d2h:.3g} GB/s ({how})"
