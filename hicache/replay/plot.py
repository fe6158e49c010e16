"""PNG charts of a replay (matplotlib, an optional extra: ``pip install hicache[plot]``).

``replay.png``: hit rate per tier against modelled time, and the TTFT CDF; ``sweep.png``: hit
rate per tier against capacity. Without matplotlib nothing is drawn and the caller is told why.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hicache.bench.plot import MISSING, pyplot
from hicache.replay.live import Record

_BINS = 40


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
        tiers["device"],
        tiers["host"],
        labels=["device (L1)", "host (L2)"],
        colors=["#3b7dd8", "#f0a830"],
        alpha=0.85,
    )
    left.plot(centres, tiers["ideal"], "k--", label="ideal (infinite cache)")
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
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def plot_sweep(
    path: Path, name: str, values: Sequence[float], summaries: Sequence[Any]
) -> str | None:
    """Draw ``sweep.png``: hit rate per tier against ``name`` (the swept capacity)."""
    plt = pyplot()
    if plt is None:
        return MISSING
    rates = {k: [s["hit_rate"][k] for s in summaries] for k in ("device", "host", "total")}
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    ax.plot(values, rates["device"], "o-", label="device (L1)")
    ax.plot(values, rates["host"], "s-", label="host (L2)")
    ax.plot(values, rates["total"], "^-", label="total")
    ax.axhline(summaries[0]["hit_rate"]["ideal"], color="k", ls="--", label="ideal")
    ax.set(
        xlabel=name,
        ylabel="prompt tokens served (%)",
        ylim=(0, 100),
        title="hit rate vs capacity (measured)",
    )
    if name == "device-tokens" and max(values) / min(values) > 8:
        ax.set_xscale("log")
        ax.minorticks_off()
    ax.set_xticks(list(values), [f"{v:,.0f}" if v == int(v) else f"{v:g}" for v in values])
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
