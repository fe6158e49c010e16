"""``--sweep NAME=V1,V2,...``: one replay per capacity, for the hit-rate-vs-capacity curve."""

from __future__ import annotations

from typing import Any

from hicache.replay.config import ReplayConfig
from hicache.replay.cost import CostModel
from hicache.replay.runner import cost_model

SWEEPABLE: dict[str, tuple[str, type]] = {
    "device-tokens": ("device_tokens", int),
    "host-ratio": ("host_ratio", float),
}


def parse_sweep(text: str) -> tuple[str, list[Any]]:
    """``"device-tokens=1024,4096"`` -> ``("device-tokens", [1024, 4096])``; ``ValueError``
    naming ``--sweep`` for an unknown name or a bad value."""
    name, sep, values = text.partition("=")
    if not sep or name not in SWEEPABLE:
        raise ValueError(f"--sweep must be one of {sorted(SWEEPABLE)}=V1,V2,..., got {text!r}")
    kind = SWEEPABLE[name][1]
    try:
        parsed = [kind(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise ValueError(
            f"--sweep {name}: values must be {kind.__name__}s, got {values!r}"
        ) from None
    if not parsed:
        raise ValueError(f"--sweep {name}: give at least one value")
    return name, sorted(set(parsed))


def sweep_configs(base: ReplayConfig, name: str, values: list[Any]) -> list[ReplayConfig]:
    """One validated config per value (all checked before any replay starts)."""
    field = SWEEPABLE[name][0]
    return [base.with_(**{field: v}) for v in values]


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
