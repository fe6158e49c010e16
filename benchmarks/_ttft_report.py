"""``bench_ttft.py``'s samples, their medians per prefix and tier, and the markdown table."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

TIERS = ("device", "host", "file", "mooncake", "miss")
LABELS = {"device": "device hit", "host": "host hit", "file": "file-store hit",
          "mooncake": "Mooncake hit", "miss": "miss (recompute)"}  # fmt: skip
# The published reference: an H20 with vLLM, 64k-token prompt (seconds; Mooncake over RDMA).
REFERENCE_64K = {"device": "0.11", "host": "0.27", "file": "-", "mooncake": "0.97 (RDMA)",
                 "miss": "15.2"}  # fmt: skip


@dataclass(frozen=True)
class Sample:
    """One request: ``tier`` measured, ``prefix`` tokens, its TTFT, the prompt tokens served
    from that tier (computed ones for a miss), the host -> device bytes and busy seconds of
    the cache's own counters (CUDA events) and, for a storage hit, the backend's bytes read
    and seconds inside its get calls."""

    tier: str
    prefix: int
    ttft_s: float
    served: int
    h2d: tuple[int, float]
    read: tuple[int, float] | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def gbps(pairs: list[tuple[int, float]]) -> float | None:
    """Total bytes over total seconds, in GB/s (1e9); None with no time."""
    seconds = sum(s for _, s in pairs)
    return sum(b for b, _ in pairs) / seconds / 1e9 if seconds > 0 else None


def row(tier: str, prefix: int, samples: list[Sample]) -> dict[str, Any]:
    """The median TTFT of ``samples`` (one tier and prefix) and their GB/s."""
    return {
        "tier": tier,
        "prefix": prefix,
        "ttft_s": statistics.median(s.ttft_s for s in samples),
        "samples_s": [s.ttft_s for s in samples],
        "served_min": min(s.served for s in samples),
        "h2d_gbps": gbps([s.h2d for s in samples]),
        "read_gbps": gbps([s.read for s in samples if s.read is not None]),
    }


def table(samples: list[Sample], prefixes: list[int], notes: dict[str, str]) -> list[dict]:
    """One row per tier and prefix that has samples (tiers in ``notes`` have none)."""
    rows = []
    for tier in TIERS:
        for prefix in prefixes:
            mine = [s for s in samples if s.tier == tier and s.prefix == prefix]
            if mine:
                rows.append(row(tier, prefix, mine))
    return rows


def cell(r: dict[str, Any]) -> str:
    """``TTFT s`` with the GB/s behind it and a warning when the tier served less than P."""
    text = f"{r['ttft_s']:.3f}"
    rates = [f"{k} {r[f'{k}_gbps']:.1f}" for k in ("read", "h2d") if r[f"{k}_gbps"] is not None]
    if r["tier"] != "device" and rates:
        text += f" ({', '.join(rates)} GB/s)"
    if r["tier"] != "miss" and r["served_min"] < r["prefix"]:
        text += f" [only {r['served_min']} tok from it]"
    return text


def size(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def markdown(rows: list[dict], info: dict[str, Any], notes: dict[str, str]) -> str:
    """The table: a row per tier, a column per prefix, then the published 64k reference."""
    prefixes = sorted({r["prefix"] for r in rows})
    by = {(r["tier"], r["prefix"]): r for r in rows}
    head = ["tier", *(f"{size(p)} prefix" for p in prefixes), "H20 + vLLM, 64k (published)"]
    lines = [
        f"TTFT in s (median of {info['repeats']}) on {info.get('gpu', info['device'])}, "
        f"{info['geometry']} geometry, page {info['page']}, {info['suffix']}-token suffix "
        "computed; GB/s: read = storage -> host (backend get calls), h2d = host -> device "
        "(the cache's counters: CUDA events on a GPU, wall time on CPU)",
        "",
        "| " + " | ".join(head) + " |",
        "| " + " | ".join("---" for _ in head) + " |",
    ]
    for tier in TIERS:
        cells = [cell(by[tier, p]) if (tier, p) in by else notes.get(tier, "-") for p in prefixes]
        lines.append(f"| {LABELS[tier]} | " + " | ".join([*cells, REFERENCE_64K[tier]]) + " |")
    return "\n".join(lines) + "\n"
