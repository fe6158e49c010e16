"""The recurrent states a run of a model with ``L`` layers held: at the end and at peak, on the
device and on the host (``cache.stats().components`` / ``.host_components``), and the memory
they stand for at ``--state-bytes`` each."""

from __future__ import annotations

from typing import Any

from hicache.radix.stats import CacheStats

COUNTERS = {  # summary key: (stats attribute, counter)
    "states_stored": ("components", "states_stored"),
    "states_evicted": ("components", "states_evicted"),
    "state_hits": ("components", "state_hits"),
    "states_backed_up": ("host_components", "states_backed_up"),
    "states_loaded": ("host_components", "states_loaded"),
}
GAUGES = {"device": ("components", "states_held"), "host": ("host_components", "host_states_held")}


def _read(stats: CacheStats, where: tuple[str, str]) -> int:
    """One state count of ``stats`` (0 when the cache keeps no such component)."""
    part = getattr(stats, where[0], None)
    return 0 if part is None else int(getattr(part, where[1]))


class StatePeaks:
    """The most states each tier held at the points ``observe`` saw (after every engine step),
    and the counters since ``before`` (the cache's stats when the run started)."""

    def __init__(self, before: CacheStats) -> None:
        self.before = before
        self.peak = dict.fromkeys(GAUGES, 0)

    def observe(self, stats: CacheStats) -> None:
        for tier, where in GAUGES.items():
            self.peak[tier] = max(self.peak[tier], _read(stats, where))

    def summary(self, stats: CacheStats) -> dict[str, int]:
        """``states_{end,peak}_{device,host}`` and the ``COUNTERS`` of the run, from ``stats``
        at its end (observed too)."""
        self.observe(stats)
        out = {f"states_end_{tier}": _read(stats, where) for tier, where in GAUGES.items()}
        out |= {f"states_peak_{tier}": peak for tier, peak in self.peak.items()}
        for key, where in COUNTERS.items():
            out[key] = _read(stats, where) - _read(self.before, where)
        return out


def _size(nbytes: float) -> str:
    gib = nbytes / 2**30
    return f"{gib:.1f} GiB" if gib >= 1 else f"{nbytes / 2**20:.1f} MiB"


def _mode_line(label: str, s: dict[str, Any], each: int) -> str:
    peak = f"peak {s['states_peak_device']} device ({_size(s['states_peak_device'] * each)})"
    end, host = f"{s['states_end_device']}", ""
    if s["states_peak_host"] or s["states_backed_up"]:  # a run with a host tier
        peak += f" + {s['states_peak_host']} host ({_size(s['states_peak_host'] * each)})"
        end += f" + {s['states_end_host']}"
        host = f"; {s['states_loaded']} restored from host"
    return (
        f"  {label} {peak}, {end} at the end; {s['states_stored']} stored, "
        f"{s['states_evicted']} evicted, {s['state_hits']} resumed from{host}"
    )


def format_states(plan: dict[str, Any], summaries: dict[str, dict[str, Any]], each: int) -> str:
    """The report's lines on states: the plan (``model_flags.state_plan``), then one line per
    mode of ``summaries``, every count also in bytes at ``each`` bytes a state."""
    track = plan["track_slots"]
    head = (
        f"recurrent states (--checkpoint {plan['checkpoint']}, {plan['state_slots']} device "
        f"slots = {_size(plan['state_slots'] * each)}"
        + (f" + {track} decode-tracking slots = {_size(track * each)}" if track else "")
        + f" at --state-bytes {each:,} = {_size(each)} each):"
    )
    width = max(len(m) for m in summaries) + 1
    lines = [_mode_line(f"{m + ':':<{width}}", s, each) for m, s in summaries.items()]
    return "\n".join([head, *lines])
