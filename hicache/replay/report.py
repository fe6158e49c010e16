"""A replay's figures: per-tier hits, transfers, evictions, modelled TTFT and throughput.

Every figure is either measured (counted on the real cache and pools, or timed on the real
transfers) or modelled (the cost model's clock); ``MEASURED`` and ``MODELLED`` name them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hicache.bench.report import evicted_tokens, storage_figures, transfer_figures
from hicache.replay.ideal import BLOCK_RULE, HIT_RULE
from hicache.replay.load import format_load, load_figures
from hicache.replay.runner import ReplayRun
from hicache.replay.states import format_states

MEASURED = (
    "tokens",
    "hit_rate",
    "transfers",
    "storage",
    "evicted_tokens",
    "replay_wall_s",
    "replay_requests_per_s",
    "memory",
    "states",
    "kv_bytes",
)
MODELLED = ("ttft_ms", "makespan_s", "throughput", "load", "queueing_dominates")
TIERS = ("device", "host", "storage", "computed")


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else 0.0


def _ttft_ms(run: ReplayRun) -> dict[str, float | None]:
    ttft = np.array([r.ttft_s for r in run.records if r.ttft_s is not None], dtype=np.float64)
    if not ttft.size:
        return {"p50": None, "p99": None, "mean": None}
    ms = ttft * 1e3
    return {
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
        "mean": float(ms.mean()),
    }


def _tokens(run: ReplayRun) -> dict[str, int]:
    served = [r for r in run.records if r.error is None]
    return {
        "prompt": sum(r.prompt_tokens for r in served),
        "device": sum(r.device_hit for r in served),
        "host": sum(r.host_hit for r in served),
        "storage": sum(r.storage_hit for r in served),
        "computed": sum(r.computed for r in served),
        "ideal": sum(r.ideal_hit for r in served),
        "block_ideal": sum(run.block_ideal[r.rid] for r in served) if run.block_ideal else 0,
        "output": sum(r.output_tokens for r in served),
    }


def _transfers(run: ReplayRun) -> dict[str, float]:
    return {"token_bytes": run.config.token_bytes, **transfer_figures(run.stats)}


def _storage(run: ReplayRun) -> dict[str, Any]:
    """The storage tier: backend, capacity (tokens; None: uncapped) and its traffic (bytes,
    busy-time GB/s each way; zeros without one)."""
    cfg = run.config
    return {
        "backend": cfg.storage,
        "capacity_tokens": cfg.storage_capacity,
        **{k.removeprefix("storage_"): v for k, v in storage_figures(run.stats).items()},
    }


def _bandwidth_source(run: ReplayRun) -> str:
    if run.config.host_ratio == 0:
        return "no host tier"
    return "measured on these pools" if run.cost.measured else "flags"


def summarize(run: ReplayRun) -> dict[str, Any]:
    """The run's figures as plain JSON-able values (None where there is no sample)."""
    tokens = _tokens(run)
    prompt, makespan = tokens["prompt"], run.modelled_s
    cfg, tb = run.config, run.config.token_bytes
    host_tokens = cfg.host_tokens if cfg.host_ratio else 0
    cost = run.cost
    load = load_figures(run.records, cost.prefill_tps, makespan)
    return {
        "requests": run.total_requests,
        "finished": sum(r.error is None for r in run.records),
        "rejected": sum(r.error is not None for r in run.records),
        "interrupted": run.interrupted,
        "tokens": tokens,
        "hit_rate": {
            **{t: _pct(tokens[t], prompt) for t in TIERS},
            "total": _pct(tokens["device"] + tokens["host"] + tokens["storage"], prompt),
            "ideal": _pct(tokens["ideal"], prompt),
            "block_ideal": _pct(tokens["block_ideal"], prompt),
        },
        "hit_rule": HIT_RULE,
        "block_rule": BLOCK_RULE,
        "tierings": {"host": run.config.tiering, "storage": run.config.storage_tiering},
        "transfers": _transfers(run),
        "storage": _storage(run),
        "evicted_tokens": evicted_tokens(run.stats),
        "ttft_ms": _ttft_ms(run),
        "makespan_s": makespan,
        "throughput": {
            "output_tok_s": tokens["output"] / makespan if makespan else 0.0,
            "prompt_tok_s": prompt / makespan if makespan else 0.0,
            "requests_s": len(run.records) / makespan if makespan else 0.0,
        },
        "cost_model": {
            "prefill_tps": cost.prefill_tps,
            "decode_step_ms": cost.decode_step_s * 1e3,
            "h2d_gb_s": cost.h2d_bytes_per_s / 1e9,
            "d2h_gb_s": cost.d2h_bytes_per_s / 1e9,
            "storage_gb_s": cost.storage_bytes_per_s / 1e9,
            "bandwidth": _bandwidth_source(run),
        },
        "replay_wall_s": run.wall_s,
        "replay_requests_per_s": len(run.records) / run.wall_s if run.wall_s else 0.0,
        "memory": run.memory.to_dict() if run.memory is not None else None,
        "states": run.states.to_dict() if run.states is not None else None,
        "kv_bytes": {"device": cfg.device_slots * tb, "host": host_tokens * tb},
        "queueing_dominates": load["queueing_dominates"],
        "load": load,
        "measured": list(MEASURED),
        "modelled": list(MODELLED),
        "first_error": next((r.error for r in run.records if r.error), None),
    }


def _num(value: float | None, fmt: str = ",.1f") -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, fmt)


def _built(s: dict[str, Any]) -> str:
    return " (not built)" if s["storage"]["backend"] == "none" else ""


def _storage_line(st: dict[str, Any]) -> list[str]:
    """The storage tier's traffic line (none without one)."""
    if st["backend"] == "none":
        return []
    cap = st["capacity_tokens"]
    return [
        f"  storage       {st['backend']}, "
        + (f"{cap:,} tokens" if cap is not None else "uncapped")
        + f": read {st['bytes_read'] / 1e6:,.1f} MB at {st['read_gb_s']:.3g} GB/s, "
        f"written {st['bytes_written'] / 1e6:,.1f} MB at {st['write_gb_s']:.3g} GB/s"
    ]


def traffic_line(s: dict[str, Any]) -> str:
    """One line: the bytes and busy-time GB/s host->device and storage reads and writes."""
    x, st = s["transfers"], s["storage"]
    line = f"host->device {x['h2d_bytes'] / 1e6:,.1f} MB at {x['h2d_gb_s']:.3g} GB/s"
    if st["backend"] == "none":
        return line
    return (
        f"{line}; storage read {st['bytes_read'] / 1e6:,.1f} MB at {st['read_gb_s']:.3g} GB/s, "
        f"written {st['bytes_written'] / 1e6:,.1f} MB at {st['write_gb_s']:.3g} GB/s (measured)"
    )


def _format_memory(m: dict[str, float] | None) -> list[str]:
    if m is None:
        return []
    kv = m["kv_device_gb"] + m["kv_host_gb"]
    return [
        f"  memory        peak RSS {m['peak_rss_gb']:.2f} GB = {m['peak_over_held']:.2f}x "
        f"(KV pools {kv:.2f} GB + tree {m['tree_gb']:.2f} GB); {m['start_rss_gb']:.2f} GB "
        "before the replay"
    ]


def format_summary(s: dict[str, Any]) -> str:
    """A few aligned lines: measured first, then modelled."""
    t, h, x, c = s["tokens"], s["hit_rate"], s["transfers"], s["cost_model"]
    ttft, tp = s["ttft_ms"], s["throughput"]
    lines = [
        f"requests        {s['finished']:,} finished, {s['rejected']:,} rejected"
        + (" (interrupted)" if s["interrupted"] else ""),
        "measured (the real cache, pools and transfers):",
        f"  prompt tokens {t['prompt']:,}: device {h['device']:.1f}%  host {h['host']:.1f}%  "
        f"storage {h['storage']:.1f}%{_built(s)}  computed {h['computed']:.1f}%",
        f"  hit rate      {h['total']:.1f}%   reachable ideal {h['ideal']:.1f}%   "
        f"block ideal {h['block_ideal']:.1f}%",
        f"  hit rules     {s['hit_rule']};",
        f"                {s['block_rule']}",
        f"  host->device  {x['h2d_bytes'] / 1e6:,.1f} MB at {x['h2d_gb_s']:.3g} GB/s   "
        f"device->host {x['d2h_bytes'] / 1e6:,.1f} MB at {x['d2h_gb_s']:.3g} GB/s "
        f"({x['token_bytes']} B/token)",
        *_storage_line(s["storage"]),
        f"  evicted       device {s['evicted_tokens']['device']:,} tokens, "
        f"host {s['evicted_tokens']['host']:,} tokens",
        f"  replay        {s['replay_wall_s']:.1f} s wall, "
        f"{s['replay_requests_per_s']:,.0f} requests/s",
        *_format_memory(s["memory"]),
        *format_states(s["states"], s["kv_bytes"]["device"], s["kv_bytes"]["host"]),
        f"modelled (prefill {c['prefill_tps']:,.0f} tok/s, decode step {c['decode_step_ms']:g} ms, "
        f"loads at {c['h2d_gb_s']:.3g} GB/s, {c['bandwidth']}"
        + (f"; storage reads at {c['storage_gb_s']:.3g} GB/s, flag" if c["storage_gb_s"] else "")
        + "):",
        *format_load(s["load"]),
        f"  TTFT          p50 {_num(ttft['p50'])} ms  p99 {_num(ttft['p99'])} ms"
        + ("  (queue-bound: the backlog, not the cache)" if s["queueing_dominates"] else ""),
        f"  throughput    {tp['output_tok_s']:,.0f} output tok/s, {tp['prompt_tok_s']:,.0f} "
        f"prompt tok/s over {s['makespan_s']:,.1f} s",
    ]
    if s["first_error"]:
        lines.append(f"note: e.g. {s['first_error']}")
    return "\n".join(lines)
