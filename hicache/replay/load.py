"""Whether the modelled compute keeps up with the trace, and the figures that hold when not.

A trace asks for ``computed`` prompt tokens (its prompts less the cache's hits) over its
arrival span; the model computes ``prefill_tps`` tokens a second. When the demand exceeds that
rate the queue grows for the whole trace: modelled TTFTs then measure the backlog (they grow
with the trace's length, to hours), not the cache, so the figures to read are the throughput's
(prompt tokens served and computed per second, the time the queue takes to drain after the
last arrival).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hicache.replay.live import Record


def load_figures(
    records: Sequence[Record], prefill_tps: float, makespan_s: float
) -> dict[str, Any]:
    """The trace's prefill demand against the modelled rate, from the replay's ``records``
    (arrival times from the trace's first arrival, 0) and its modelled ``makespan_s``.

    ``demand_tok_s`` and ``utilization`` are None when every request arrives at once (then any
    prompt token to compute makes queueing dominate)."""
    served = [r for r in records if r.error is None]
    computed = sum(r.computed for r in served)
    span = max((r.arrival_s for r in records), default=0.0)
    compute_s = computed / prefill_tps
    return {
        "queueing_dominates": compute_s > span,
        "computed_tokens": computed,
        "arrival_span_s": span,
        "demand_tok_s": computed / span if span else None,
        "prefill_tps": prefill_tps,
        "utilization": compute_s / span if span else None,
        "computed_tok_s": computed / makespan_s if makespan_s else 0.0,
        "drain_s": max(makespan_s - span, 0.0),
    }


def format_load(load: dict[str, Any]) -> list[str]:
    """Lines of the modelled section: the demand against the rate, and what bounds the run."""
    rate = f"the model computes {load['prefill_tps']:,.0f}"
    if load["demand_tok_s"] is None:
        asked = f"{load['computed_tokens']:,} prompt tokens to compute, all at once"
    else:
        asked = (
            f"{load['demand_tok_s']:,.0f} tok/s of prefill asked ({load['computed_tokens']:,} "
            f"tokens over {load['arrival_span_s']:,.1f} s)"
        )
    if not load["queueing_dominates"]:
        return [f"  load          {asked}; {rate} ({100 * (load['utilization'] or 0):.0f}% busy)"]
    return [
        f"  load          {asked}; {rate}: QUEUEING DOMINATES",
        f"  bound         {load['computed_tok_s']:,.0f} tok/s computed; the queue drains "
        f"{load['drain_s']:,.1f} s after the last arrival (read throughput, not TTFT)",
    ]
