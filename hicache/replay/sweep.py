"""``--sweep NAME=V1,V2,...``: one replay per capacity, for the hit-rate-vs-capacity curve."""

from __future__ import annotations

from typing import Any

from hicache.replay.config import ReplayConfig

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
