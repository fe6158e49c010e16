"""``hicache bench --storage file|mooncake``: the workload cold over the storage tier, then the
same conversations in a fresh process warm from storage alone.

Phase 1 (``cold``), in a process of its own: an engine with the host tier and the storage tier
runs the workload; every prefix is computed and its pages are backed up to storage; the
transfers are drained at the end. Phase 2, in a fresh process (new model, new engine, empty
device and host tiers): the same conversations (``warm-storage``), then once more on that
engine (``warm-host``: the reference where the tiers above storage hold the prefixes). Every
request of a run carries one fresh ``cache_salt``, so phase 1 starts cold even over a store
that outlived earlier runs, and no other run's pages can hit. With ``--tp N`` each phase
process is N rank processes (``bench.tp_run``), each storing and reading its shard's pages.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TextIO

from hicache.bench.config import BenchConfig
from hicache.bench.report import format_table
from hicache.bench.runner import (
    device_name,
    finite,
    headline,
    measure,
    prepare_out_dir,
    torch_threads,
    warm_up,
)
from hicache.bench.tp_run import run_tp, tp_line
from hicache.engine import build_engine
from hicache.model import TinyTransformer, TPShard

PHASES = ("cold", "warm-storage", "warm-host")

STORAGE_ROWS: list[tuple[str, str, str]] = [  # (label, key, format)
    ("requests served", "requests", "{:d}"),
    ("rejected", "rejected", "{:d}"),
    ("hit rate: device (L1)", "device_hit_rate", "{:.1f}%"),
    ("hit rate: host (L2)", "host_hit_rate", "{:.1f}%"),
    ("hit rate: storage (L3)", "storage_hit_rate", "{:.1f}%"),
    ("hit rate: total", "hit_rate", "{:.1f}%"),
    ("prefill tokens computed", "computed_tokens", "{:,d}"),
    ("tokens from storage", "storage_hit_tokens", "{:,d}"),
    ("TTFT mean (ms)", "ttft_mean_ms", "{:.1f}"),
    ("TTFT p50 (ms)", "ttft_p50_ms", "{:.1f}"),
    ("TTFT p90 (ms)", "ttft_p90_ms", "{:.1f}"),
    ("throughput (out tok/s)", "output_tok_s", "{:.1f}"),
    ("throughput (all tok/s)", "total_tok_s", "{:.0f}"),
    ("wall time (s)", "wall_s", "{:.1f}"),
    ("host->device (MB)", "h2d_bytes", "mb"),
    ("storage read (MB)", "storage_bytes_read", "mb"),
    ("storage read (GB/s)", "storage_read_gb_s", "{:.3f}"),
    ("storage written (MB)", "storage_bytes_written", "mb"),
    ("storage write (GB/s)", "storage_write_gb_s", "{:.3f}"),
    ("storage hit pages", "storage_hit_pages", "{:,d}"),
    ("storage pages backed up", "storage_backup_pages", "{:,d}"),
    ("storage failures", "storage_failures", "{:,d}"),
]

STORAGE_NOTES = """\
cold: phase 1 process, host tier + storage, nothing stored yet for this run; pages backed up.
warm-storage: phase 2, a fresh process (empty device and host tiers), the same conversations.
warm-host: phase 2 once more on the same engine (the prefixes are on the device or host).
TTFT: arrival to first token, queueing and prefetch waits included.
GB/s: bytes / busy time of the storage calls (the backend's I/O threads)."""


def run_storage_bench(
    cfg: BenchConfig, progress: bool = True, out: TextIO | None = None
) -> dict[str, Any]:
    """Run the phases, print the table then the comparison, write ``results.json`` to ``out_dir``.

    ``ValueError`` (before any work) when ``cfg.storage`` is None, ``out_dir`` cannot be
    created or the pools do not fit in memory.
    """
    if cfg.storage is None:
        raise ValueError("run_storage_bench needs --storage file|mooncake")
    out = out if out is not None else sys.stdout
    out_dir = prepare_out_dir(cfg)
    salt = f"bench-{uuid.uuid4().hex[:16]}"
    results: dict[str, Any] = {"config": cfg.to_dict(), "device": device_name(cfg.device)}
    with _storage_root(cfg) as root:
        results["storage"] = {"backend": cfg.storage, "root": root, "cache_salt": salt}
        results.update(in_fresh_process(cfg, root, salt, PHASES[:1], progress))
        results.update(in_fresh_process(cfg, root, salt, PHASES[1:], progress))
    (out_dir / "results.json").write_text(json.dumps(finite(results), indent=2, allow_nan=False))
    summaries = {p: results[p]["summary"] for p in PHASES}
    out.write(headline(cfg, results["device"]) + f"; storage {cfg.storage}\n\n")
    out.write(format_table(summaries, STORAGE_ROWS, STORAGE_NOTES) + "\n\n")
    out.write(format_warm(summaries["cold"], summaries["warm-storage"]) + "\n")
    if cfg.tp > 1:
        out.write(tp_line(cfg, results))
    out.write(f"results: {out_dir / 'results.json'}\n")
    return results


def in_fresh_process(
    cfg: BenchConfig, root: str | None, salt: str, phases: Sequence[str], progress: bool
) -> dict[str, Any]:
    """``run_phases`` in a new (spawned) Python process, or ``cfg.tp`` rank processes; its
    results (rank 0's, once every rank saw the same hits)."""
    if cfg.tp > 1:
        return run_tp(run_phases, cfg, progress, list(phases), root, salt, tuple(phases))
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        result: dict[str, Any] = pool.submit(
            run_phases, cfg, root, salt, tuple(phases), progress
        ).result()
    return result


def run_phases(
    cfg: BenchConfig,
    root: str | None,
    salt: str,
    phases: Sequence[str],
    progress: bool,
    group: Any = None,
) -> dict[str, Any]:
    """Build the model (this rank's shard of ``group``; None: one rank) and one engine with the
    storage tier (file store under ``root``), run the workload once per phase name, salted
    with ``salt``; ``{phase: results}``."""
    with torch_threads(cfg.threads):
        model = TinyTransformer(cfg.model_config(), cfg.device, TPShard.of(group))
        warm_up(model, cfg)
        spec = cfg.cache_spec("hiradix", cfg.storage_config(root))
        engine = build_engine(model, spec, cfg.engine_config())
        return {phase: measure(engine, cfg, phase, progress, salt) for phase in phases}


@contextlib.contextmanager
def _storage_root(cfg: BenchConfig) -> Iterator[str | None]:
    """The file store's directory (``--storage-dir``, else a temporary one removed after the
    run); None for Mooncake."""
    if cfg.storage != "file":
        yield None
    elif cfg.storage_dir is not None:
        try:
            Path(cfg.storage_dir).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ValueError(f"--storage-dir {cfg.storage_dir}: cannot create it") from err
        yield cfg.storage_dir
    else:
        with tempfile.TemporaryDirectory(prefix="hicache-l3-") as root:
            yield root


def format_warm(cold: dict[str, Any], warm: dict[str, Any]) -> str:
    """One line: what starting warm from storage changed against the cold run."""
    return (
        f"warm from storage vs cold: hit rate {cold['hit_rate']:.1f}% -> "
        f"{warm['hit_rate']:.1f}% (storage {warm['storage_hit_rate']:.1f}%), prefill tokens "
        f"computed {cold['computed_tokens']:,} -> {warm['computed_tokens']:,}, TTFT mean "
        f"{cold['ttft_mean_ms']:.0f} -> {warm['ttft_mean_ms']:.0f} ms, p50 "
        f"{cold['ttft_p50_ms']:.0f} -> {warm['ttft_p50_ms']:.0f} ms, p90 "
        f"{cold['ttft_p90_ms']:.0f} -> {warm['ttft_p90_ms']:.0f} ms, throughput "
        f"{cold['total_tok_s']:.0f} -> {warm['total_tok_s']:.0f} tok/s"
    )
