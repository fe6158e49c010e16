"""Turn request records and the cache's counters into a summary, per-round series and a table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hicache.bench.workload import Record
from hicache.radix.stats import CacheStats


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else 0.0


def _ttfts_ms(records: Sequence[Record]) -> np.ndarray:
    return np.array([r.ttft_s * 1e3 for r in records if r.ttft_s is not None], dtype=np.float64)


def _quantile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else float("nan")


def _since(now: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    """``now`` less ``before`` item by item (``now`` itself when ``before`` is None)."""
    return dict(now) if before is None else {k: v - before[k] for k, v in now.items()}


def _gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds else 0.0


def _transfer_counts(stats: CacheStats) -> dict[str, Any]:
    t = stats.transfer
    if t is None:
        return {"h2d_bytes": 0, "d2h_bytes": 0, "h2d_busy_s": 0.0, "d2h_busy_s": 0.0}
    return {
        "h2d_bytes": t.h2d_bytes,
        "d2h_bytes": t.d2h_bytes,
        "h2d_busy_s": t.h2d_seconds,
        "d2h_busy_s": t.d2h_seconds,
    }


def transfer_figures(stats: CacheStats, before: CacheStats | None = None) -> dict[str, float]:
    """Bytes, busy seconds and GB/s each way from ``stats`` (since ``before`` when given;
    zeros without a host tier)."""
    c = _since(_transfer_counts(stats), None if before is None else _transfer_counts(before))
    return {
        **c,
        "h2d_gb_s": _gbps(c["h2d_bytes"], c["h2d_busy_s"]),
        "d2h_gb_s": _gbps(c["d2h_bytes"], c["d2h_busy_s"]),
    }


STORAGE_COUNTS = (  # StorageTierStats counters a run reports (as ``storage_<name>``)
    "queries",
    "hit_pages",
    "prefetches",
    "prefetch_loaded_tokens",
    "backup_pages",
    "bytes_read",
    "bytes_written",
    "read_seconds",
    "write_seconds",
    "failures",
)


def _storage_counts(stats: CacheStats) -> dict[str, Any]:
    s = stats.storage
    return {name: 0 if s is None else getattr(s, name) for name in STORAGE_COUNTS}


def storage_figures(stats: CacheStats, before: CacheStats | None = None) -> dict[str, Any]:
    """The storage tier's counters (``storage_`` + ``STORAGE_COUNTS``) since ``before`` (or
    all), with read and write GB/s over busy time; zeros without a storage tier."""
    c = _since(_storage_counts(stats), None if before is None else _storage_counts(before))
    return {
        **{f"storage_{k}": v for k, v in c.items()},
        "storage_read_gb_s": _gbps(c["bytes_read"], c["read_seconds"]),
        "storage_write_gb_s": _gbps(c["bytes_written"], c["write_seconds"]),
    }


def evicted_tokens(stats: CacheStats, before: CacheStats | None = None) -> dict[str, int]:
    """Tokens evicted from each tier (``host`` 0 without a host tier), since ``before``."""

    def counts(s: CacheStats) -> dict[str, int]:
        return {"device": s.device.evicted_tokens, "host": s.host.evicted_tokens if s.host else 0}

    return _since(counts(stats), None if before is None else counts(before))


def summarize(
    records: Sequence[Record], wall_s: float, stats: CacheStats, before: CacheStats | None = None
) -> dict[str, Any]:
    """Totals of one run: hit rates per tier, tokens, TTFT, throughput; transfers, storage
    traffic and evictions from the cache's ``stats`` at the end of the run (less ``before``,
    its stats at the start, when the cache served earlier runs)."""
    served = [r for r in records if r.error is None]
    prompt = sum(r.prompt_tokens for r in served)
    device = sum(r.device_hit for r in served)
    host = sum(r.host_hit for r in served)
    storage = sum(r.storage_hit for r in served)
    output = sum(r.output_tokens for r in served)
    ttft = _ttfts_ms(served)
    evicted = evicted_tokens(stats, before)
    return {
        "requests": len(served),
        "rejected": len(records) - len(served),
        "wall_s": wall_s,
        "prompt_tokens": prompt,
        "reused_tokens": device + host + storage,
        "computed_tokens": sum(r.computed for r in served),
        "output_tokens": output,
        "device_hit_rate": _pct(device, prompt),
        "host_hit_rate": _pct(host, prompt),
        "storage_hit_rate": _pct(storage, prompt),
        "storage_hit_tokens": storage,
        "hit_rate": _pct(device + host + storage, prompt),
        "ttft_mean_ms": float(ttft.mean()) if ttft.size else float("nan"),
        "ttft_p50_ms": _quantile(ttft, 50),
        "ttft_p90_ms": _quantile(ttft, 90),
        "ttft_p99_ms": _quantile(ttft, 99),
        "output_tok_s": output / wall_s,
        "total_tok_s": (prompt + output) / wall_s,
        **transfer_figures(stats, before),
        **storage_figures(stats, before),
        "device_evicted_tokens": evicted["device"],
        "host_evicted_tokens": evicted["host"],
        "first_error": next((r.error for r in records if r.error is not None), None),
    }


def per_round(records: Sequence[Record], rounds: int) -> list[dict[str, float]]:
    """Hit rate (%, total and per tier: device, host, storage), TTFT p50/mean (ms) and every
    TTFT sample (ms) of each round's served requests."""
    out = []
    for rnd in range(rounds):
        rs = [r for r in records if r.round == rnd and r.error is None]
        prompt = sum(r.prompt_tokens for r in rs)
        ttft = _ttfts_ms(rs)
        out.append(
            {
                "round": rnd + 1,
                "requests": len(rs),
                "hit_rate": _pct(
                    sum(r.device_hit + r.host_hit + r.storage_hit for r in rs), prompt
                ),
                "device_hit_rate": _pct(sum(r.device_hit for r in rs), prompt),
                "host_hit_rate": _pct(sum(r.host_hit for r in rs), prompt),
                "storage_hit_rate": _pct(sum(r.storage_hit for r in rs), prompt),
                "ttft_p50_ms": _quantile(ttft, 50),
                "ttft_mean_ms": float(ttft.mean()) if ttft.size else float("nan"),
                "ttft_ms": ttft.tolist(),
            }
        )
    return out


ROWS: list[tuple[str, str, str]] = [  # (label, key, format)
    ("requests served", "requests", "{:d}"),
    ("rejected", "rejected", "{:d}"),
    ("hit rate: device (L1)", "device_hit_rate", "{:.1f}%"),
    ("hit rate: host (L2)", "host_hit_rate", "{:.1f}%"),
    ("hit rate: total", "hit_rate", "{:.1f}%"),
    ("prefill tokens computed", "computed_tokens", "{:,d}"),
    ("prefill tokens reused", "reused_tokens", "{:,d}"),
    ("TTFT p50 (ms)", "ttft_p50_ms", "{:.1f}"),
    ("TTFT p99 (ms)", "ttft_p99_ms", "{:.1f}"),
    ("throughput (out tok/s)", "output_tok_s", "{:.1f}"),
    ("throughput (all tok/s)", "total_tok_s", "{:.0f}"),
    ("wall time (s)", "wall_s", "{:.1f}"),
    ("host->device (MB)", "h2d_bytes", "mb"),
    ("host->device (GB/s)", "h2d_gb_s", "{:.2f}"),
    ("device->host (MB)", "d2h_bytes", "mb"),
    ("device->host (GB/s)", "d2h_gb_s", "{:.2f}"),
    ("evicted from device (tok)", "device_evicted_tokens", "{:,d}"),
    ("evicted from host (tok)", "host_evicted_tokens", "{:,d}"),
]


def _cell(fmt: str, value: Any) -> str:
    return f"{value / 1e6:,.1f}" if fmt == "mb" else fmt.format(value)


NOTES = """\
TTFT: arrival to first token, queueing included. Users' first turns all arrive at once unless
  --arrival-rate is set, and --max-running requests run at a time, so most of it is waiting.
throughput (all tok/s): (prompt + output tokens) / wall time, reused prompt tokens included;
  out tok/s counts generated tokens only.
GB/s: bytes / busy time of the copy calls (on CPU, memcpy by the cores that run the model)."""


def format_table(
    summaries: dict[str, dict[str, Any]],
    rows: Sequence[tuple[str, str, str]] = ROWS,
    notes: str = NOTES,
) -> str:
    """A fixed-width table: one row per metric (``rows``), one column per mode, then
    ``notes``."""
    modes = list(summaries)
    width = max(len(m) for m in modes) + 2
    lines = [f"{'metric':<28}" + "".join(f"{m:>{width}}" for m in modes)]
    lines.append("-" * len(lines[0]))
    for label, key, fmt in rows:
        cells = "".join(f"{_cell(fmt, summaries[m][key]):>{width}}" for m in modes)
        lines.append(f"{label:<28}{cells}")
    return "\n".join([*lines, "", notes])


def format_gain(base: dict[str, Any], tier: dict[str, Any]) -> str:
    """One line: what the host tier changed against the device-only baseline."""
    computed = base["computed_tokens"]
    change = round(_pct(tier["computed_tokens"] - computed, computed)) or 0  # never "-0"
    return (
        f"host tier vs device-only: hit rate {base['hit_rate']:.1f}% -> {tier['hit_rate']:.1f}%, "
        f"prefill tokens computed {computed:,} -> {tier['computed_tokens']:,} ({change:+d}%), "
        f"TTFT p50 {base['ttft_p50_ms']:.0f} -> {tier['ttft_p50_ms']:.0f} ms, "
        f"p99 {base['ttft_p99_ms']:.0f} -> {tier['ttft_p99_ms']:.0f} ms, "
        f"throughput {base['total_tok_s']:.0f} -> {tier['total_tok_s']:.0f} tok/s"
    )
