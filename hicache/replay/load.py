"""Whether the modelled compute keeps up with the trace, and the figures that hold when not.

A trace asks for ``computed`` prompt tokens (its prompts less the cache's hits) over its
arrival span; the model computes ``prefill_tps`` tokens a second. Queueing dominates when that
demand exceeds the rate, or when requests wait longer to be admitted (``max_running``, KV
slots: decode holds them too) than they then take to their first token (the median of each).
The queue then grows through the trace and modelled TTFTs measure the backlog (to hours on a
long trace), not the cache: the figures to read are the throughput's (tokens served and
computed per second, the time the queue takes to drain after the last arrival).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hicache.replay.live import Record


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def load_figures(
    records: Sequence[Record], prefill_tps: float, makespan_s: float
) -> dict[str, Any]:
    """The trace's prefill demand against the modelled rate, and the admission waits, from the
    replay's ``records`` (arrival times from the trace's first arrival, 0) and its modelled
    ``makespan_s``.

    ``demand_tok_s`` and ``utilization`` are None when every request arrives at once (then any
    prompt token to compute is over the rate); the medians are None without a served request.
    """
    served = [r for r in records if r.error is None]
    computed = sum(r.computed for r in served)
    span = max((r.arrival_s for r in records), default=0.0)
    compute_s = computed / prefill_tps
    wait = _median([r.wait_s for r in served if r.wait_s is not None])
    service = _median(
        [
            r.first_token_s - r.admitted_s
            for r in served
            if r.first_token_s is not None and r.admitted_s is not None
        ]
    )
    over_rate = compute_s > span
    return {
        "queueing_dominates": over_rate or (wait or 0.0) > (service or 0.0),
        "demand_over_rate": over_rate,
        "computed_tokens": computed,
        "arrival_span_s": span,
        "demand_tok_s": computed / span if span else None,
        "prefill_tps": prefill_tps,
        "utilization": compute_s / span if span else None,
        "wait_p50_s": wait,
        "admitted_to_first_token_p50_s": service,
        "computed_tok_s": computed / makespan_s if makespan_s else 0.0,
        "drain_s": max(makespan_s - span, 0.0),
    }


def _asked(load: dict[str, Any]) -> str:
    rate = f"the model computes {load['prefill_tps']:,.0f}"
    if load["demand_tok_s"] is None:
        return f"{load['computed_tokens']:,} prompt tokens to compute, all at once; {rate}"
    busy = f" ({100 * load['utilization']:.0f}% busy)" if not load["demand_over_rate"] else ""
    return (
        f"{load['demand_tok_s']:,.0f} tok/s of prefill asked ({load['computed_tokens']:,} "
        f"tokens over {load['arrival_span_s']:,.1f} s); {rate}{busy}"
    )


def format_load(load: dict[str, Any]) -> list[str]:
    """Lines of the modelled section: the demand against the rate, the admission wait, and
    what bounds the run when queueing dominates."""
    wait, service = load["wait_p50_s"], load["admitted_to_first_token_p50_s"]
    waits = (
        f"  queue         p50 {wait:,.2f} s from arrival to admission, then {service:,.2f} s "
        "to the first token"
        if wait is not None and service is not None
        else "  queue         no request served"
    )
    lines = [f"  load          {_asked(load)}", waits]
    if load["queueing_dominates"]:
        lines[-1] += ": QUEUEING DOMINATES"
        lines.append(
            f"  bound         {load['computed_tok_s']:,.0f} tok/s computed; the queue drains "
            f"{load['drain_s']:,.1f} s after the last arrival (read throughput, not TTFT)"
        )
    return lines
