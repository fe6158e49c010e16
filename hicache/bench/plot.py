"""``rounds.png`` of a bench run (matplotlib, an optional extra: ``pip install hicache[plot]``).

Four panels, device-only next to the host tier: the share of each round's prompt tokens served
by each tier, the TTFT CDF, where all prompt tokens came from, and the KV bytes moved between
the tiers. Without matplotlib nothing is drawn and the caller is told why.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

MISSING = "matplotlib is not installed (pip install 'hicache[plot]'): no PNG written"
TIER_COLORS = {"device (L1)": "#3b7dd8", "host (L2)": "#f0a830", "computed": "#c8c8c8"}
MODE_STYLES = {"device-only": ("#7a7a7a", "--"), "host-tier": ("#d9480f", "-")}


def pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _hit_per_round(ax: Any, results: Mapping[str, Any]) -> None:
    """Stacked bars per round, one pair (device-only, host tier) per round."""
    from matplotlib.patches import Patch

    modes = list(results)
    width = 0.8 / len(modes)
    for k, mode in enumerate(modes):
        rounds = results[mode]["rounds"]
        x = np.arange(1, len(rounds) + 1) + (k - (len(modes) - 1) / 2) * width
        device = np.array([r["device_hit_rate"] for r in rounds])
        host = np.array([r["host_hit_rate"] for r in rounds])
        hatch = None if k == 0 else "//"
        ax.bar(x, device, width * 0.95, color=TIER_COLORS["device (L1)"], hatch=hatch, ec="white")
        ax.bar(
            x,
            host,
            width * 0.95,
            bottom=device,
            color=TIER_COLORS["host (L2)"],
            hatch=hatch,
            ec="white",
        )
    handles = [Patch(color=TIER_COLORS[t], label=t) for t in ("device (L1)", "host (L2)")]
    handles.append(Patch(fc="white", ec="#555555", hatch="//", label="hatched: host-tier run"))
    ax.legend(handles=handles, loc="upper left", fontsize=8)
    ax.set(
        xlabel="round (left bar: device-only run, right bar: host-tier run)",
        ylabel="prompt tokens served from cache (%)",
        ylim=(0, 100),
        title="hit rate per round, per tier",
    )
    ax.set_xticks(np.arange(1, len(rounds) + 1))
    ax.grid(axis="y", alpha=0.3)


def _ttft_cdf(ax: Any, results: Mapping[str, Any]) -> None:
    samples = {
        m: np.sort([t for r in res["rounds"] for t in r["ttft_ms"]]) for m, res in results.items()
    }
    longest = max((float(s[-1]) for s in samples.values() if s.size), default=0.0)
    unit, scale = ("s", 1e3) if longest >= 2000 else ("ms", 1.0)
    for mode, res in results.items():
        ttft = samples[mode] / scale
        color, style = MODE_STYLES.get(mode, ("k", "-"))
        p50 = res["summary"]["ttft_p50_ms"] / scale
        ax.step(
            ttft,
            np.arange(1, len(ttft) + 1) / max(len(ttft), 1),
            where="post",
            color=color,
            ls=style,
            lw=2,
            label=f"{mode} (p50 {p50:.3g} {unit})",
        )
    ax.set(
        xlabel=f"time to first token ({unit}), queueing included",
        ylabel="fraction of requests",
        ylim=(0, 1.02),
        title="TTFT CDF",
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")


def _tokens_by_source(ax: Any, results: Mapping[str, Any]) -> None:
    modes = list(results)
    left = np.zeros(len(modes))
    for tier, key in (("device (L1)", "device_hit_rate"), ("host (L2)", "host_hit_rate")):
        share = np.array([results[m]["summary"][key] for m in modes])
        ax.barh(modes, share, left=left, color=TIER_COLORS[tier], label=tier)
        left += share
    ax.barh(modes, 100 - left, left=left, color=TIER_COLORS["computed"], label="computed")
    for y, m in enumerate(modes):
        s = results[m]["summary"]
        ax.text(
            101,
            y,
            f"{s['hit_rate']:.0f}% reused\n{s['computed_tokens']:,} computed",
            va="center",
            fontsize=9,
        )
    ax.set(
        xlim=(0, 135),
        xlabel="prompt tokens, all rounds (%)",
        title="where the prompt tokens came from",
    )
    ax.set_xticks([0, 25, 50, 75, 100])
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize=8)


def _mb(v: float) -> str:
    return "none" if not v else f"{v:,.0f} MB" if v >= 10 else f"{v:.2g} MB"


def _bytes_moved(ax: Any, results: Mapping[str, Any]) -> None:
    modes = list(results)
    x = np.arange(len(modes))
    rows = (
        ("device->host (backup)", "d2h_bytes", "#6a4c93", -0.2),
        ("host->device (load back)", "h2d_bytes", "#f0a830", 0.2),
    )
    for label, key, color, dx in rows:
        mb = np.array([results[m]["summary"][key] / 1e6 for m in modes])
        bars = ax.bar(x + dx, mb, 0.38, color=color, label=label)
        ax.bar_label(bars, [_mb(v) for v in mb], fontsize=9)
    ax.set_xticks(x, modes)
    ax.set(ylabel="KV bytes moved (MB)", title="KV moved between device and host")
    ax.margins(y=0.15)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def plot_rounds(path: str | Path, results: Mapping[str, Any], title: str = "") -> str | None:
    """Draw ``rounds.png`` at ``path`` from ``{mode: {"summary": ..., "rounds": ...}}``
    (``hicache.bench.report``'s ``summarize`` and ``per_round``); returns why not (None when
    drawn)."""
    plt = pyplot()
    if plt is None:
        return MISSING
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5), layout="constrained")
    _hit_per_round(axes[0][0], results)
    _ttft_cdf(axes[0][1], results)
    _tokens_by_source(axes[1][0], results)
    _bytes_moved(axes[1][1], results)
    if title:
        fig.suptitle("\n".join(textwrap.wrap(title, 150)), fontsize=10)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
