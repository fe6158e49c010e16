"""PNG charts of a replay (matplotlib, an optional extra: ``pip install hicache[plot]``).

``replay.png``: hit rate per tier against modelled time, and the TTFT CDF; ``sweep.png``: hit
rate per tier of each point of the sweep (stacked bars, the points in the table's order).
Without matplotlib nothing is drawn and the caller is told why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hicache.bench.plot import MISSING, pyplot
from hicache.replay.live import Record

_BINS = 40
_TIERS = {  # tier: (legend, colour)
    "device": ("device (L1)", "#3b7dd8"),
    "host": ("host (L2)", "#f0a830"),
    "storage": ("storage (L3)", "#5aa469"),
}


def _per_bin(records: Sequence[Record]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Arrival-time bins: centres (s) and each tier's share of the bin's prompt tokens (%)."""
    served = [r for r in records if r.error is None]
    t = np.array([r.arrival_s for r in served])
    edges = np.linspace(t.min(), t.max() + 1e-9, _BINS + 1)
    which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, _BINS - 1)

    def share(values: list[int]) -> np.ndarray:
        num = np.bincount(which, weights=values, minlength=_BINS)
        den = np.bincount(which, weights=[r.prompt_tokens for r in served], minlength=_BINS)
        return 100 * num / np.maximum(den, 1)

    tiers = {
        "device": share([r.device_hit for r in served]),
        "host": share([r.host_hit for r in served]),
        "storage": share([r.storage_hit for r in served]),
        "ideal": share([r.ideal_hit for r in served]),
    }
    return (edges[:-1] + edges[1:]) / 2, tiers


def plot_replay(path: Path, records: Sequence[Record], title: str) -> str | None:
    """Draw ``replay.png`` at ``path``; returns why not (None when drawn)."""
    plt = pyplot()
    if plt is None:
        return MISSING
    if not any(r.error is None for r in records):
        return "no finished request: no PNG written"
    centres, tiers = _per_bin(records)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    left.stackplot(
        centres,
        *(tiers[t] for t in _TIERS),
        labels=[label for label, _ in _TIERS.values()],
        colors=[colour for _, colour in _TIERS.values()],
        alpha=0.85,
    )
    left.plot(centres, tiers["ideal"], "k--", label="reachable ideal (infinite cache)")
    left.set(
        xlabel="arrival time, modelled (s)",
        ylabel="prompt tokens served (%)",
        ylim=(0, 100),
        title="hit rate per tier (measured)",
    )
    left.legend(loc="lower right")
    ttft = np.sort([r.ttft_s * 1e3 for r in records if r.ttft_s is not None])
    right.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft))
    right.set(
        xscale="log",
        xlabel="TTFT, modelled (ms)",
        ylabel="fraction of requests",
        ylim=(0, 1),
        title="TTFT CDF (modelled)",
    )
    right.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _tick(value: Any) -> str:
    return (
        f"{value:g}"
        if isinstance(value, float)
        else f"{value:,}"
        if isinstance(value, int)
        else str(value)
    )


def plot_sweep(
    path: Path, grid: Mapping[str, Sequence[Any]], summaries: Sequence[Any]
) -> str | None:
    """Draw ``sweep.png``: a stacked bar of hit rate per tier for each run of ``summaries``
    (each holding its point's ``grid`` names), the reachable ideal dashed."""
    plt = pyplot()
    if plt is None:
        return MISSING
    x = np.arange(len(summaries))
    fig, ax = plt.subplots(figsize=(max(7.0, 0.6 * len(x) + 3), 5), layout="constrained")
    bottom = np.zeros(len(x))
    for tier, (label, colour) in _TIERS.items():
        rate = np.array([s["hit_rate"][tier] for s in summaries])
        ax.bar(x, rate, bottom=bottom, color=colour, label=label)
        bottom += rate
    ax.axhline(summaries[0]["hit_rate"]["ideal"], color="k", ls="--", label="reachable ideal")
    for i, s in enumerate(summaries):  # the storage tier's read GB/s (busy time) on its bar
        if s["storage"]["backend"] != "none":
            gbps = s["storage"]["read_gb_s"]
            ax.text(i, bottom[i] + 1, f"read {gbps:.2g} GB/s", ha="center", fontsize=7)
    names = list(grid)
    ticks = ["\n".join(_tick(s[n]) for n in names) for s in summaries]
    ax.set_xticks(x, ticks, fontsize=8)
    ax.set_xlabel(" / ".join(names))
    ax.set(ylabel="prompt tokens served (%)", ylim=(0, 100), title="hit rate per tier (measured)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(loc="lower right")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
