"""``hicache replay``: the command (one replay, or a capacity sweep); its options are in
``hicache.replay.options``.

Bad arguments and bad traces exit with status 2 and one line on stderr; Ctrl-C prints and
writes what was measured so far and exits 130.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

import torch

from hicache.bench.progress import ProgressBar
from hicache.kv_events import KVEventsConfig, make_sink
from hicache.replay.config import ReplayConfig
from hicache.replay.cost import CostModel
from hicache.replay.generate import GenerateSpec, generate_trace
from hicache.replay.options import GENERATE_OPTIONS
from hicache.replay.plot import plot_replay, plot_sweep
from hicache.replay.report import format_summary, summarize, traffic_line
from hicache.replay.runner import ReplayRun, replay
from hicache.replay.sweep import (
    describe_bandwidth,
    grid_points,
    has_states,
    parse_sweep,
    sweep_configs,
    sweep_cost,
    sweep_header,
    sweep_row,
    total_capacity,
)
from hicache.replay.trace import Trace, read_trace, write_trace


def _trace(args: argparse.Namespace) -> Trace:
    if args.generate:
        if args.trace:
            raise ValueError("give a TRACE or --generate OUT, not both")
        given = {k: getattr(args, k) for k in GENERATE_OPTIONS if getattr(args, k) is not None}
        given["block_tokens"] = args.block_tokens
        spec = GenerateSpec.preset(args.preset, **given) if args.preset else GenerateSpec(**given)
        write_trace(args.generate, generate_trace(spec))
        args.trace = args.generate
    elif args.preset:
        raise ValueError("--preset needs --generate OUT")
    if not args.trace:
        raise ValueError("give a TRACE file (or --generate OUT)")
    trace = read_trace(args.trace, block_tokens=args.block_tokens, skip_bad=args.skip_bad)
    if args.limit is not None:
        if args.limit < 1:
            raise ValueError(f"--limit must be positive, got {args.limit}")
        trace = Trace(
            trace.requests[: args.limit], trace.block_tokens, trace.skipped, trace.first_error
        )
    return trace


def _one(
    trace: Trace,
    cfg: ReplayConfig,
    label: str,
    args: argparse.Namespace,
    cost: CostModel | None = None,
    events: Any = None,
) -> ReplayRun:
    bar = None if args.no_progress else ProgressBar(len(trace.requests), label)
    try:
        run = replay(
            trace,
            cfg,
            (lambda _r: bar.update()) if bar is not None else None,
            cost,
            events,
            check_invariants=args.check_invariants,
        )
    finally:
        if events is not None:
            events.close()
    if bar is not None:
        bar.close()
    return run


def _events(args: argparse.Namespace) -> KVEventsConfig | None:
    """``--kv-events`` (and ``--kv-events-replay``) as a publisher's config, or None."""
    endpoint, replay_at = getattr(args, "kv_events", None), getattr(args, "kv_events_replay", None)
    if endpoint is None:
        if replay_at is not None:
            raise ValueError("--kv-events-replay needs --kv-events")
        return None
    if args.sweep:
        raise ValueError("--kv-events publishes one replay: not with --sweep")
    return KVEventsConfig(endpoint, replay_at)


def _write(out_dir: Path, name: str, payload: dict[str, Any]) -> Path:
    path = out_dir / name
    path.write_text(json.dumps(payload, indent=2, allow_nan=False))
    return path


def _tiers(cfg: ReplayConfig) -> str:
    if not cfg.host_ratio:
        return "no host tier"
    host = f"host x{cfg.host_ratio:g} ({cfg.tiering})"
    if cfg.storage == "none":
        return host
    cap = "uncapped" if cfg.storage_capacity is None else f"{cfg.storage_capacity:,} tokens"
    return f"{host}, storage {cfg.storage} {cap} ({cfg.storage_tiering})"


def _model(cfg: ReplayConfig) -> str:
    """``"; model FSL (window 128), states at finish+branch, 74 MB each"`` ('' if plain)."""
    if not cfg.hybrid:
        return ""
    window = f" (window {cfg.window})" if "S" in (cfg.layers_pattern or "") else ""
    states = ""
    if "L" in (cfg.layers_pattern or ""):
        states = f", states at {cfg.checkpoint}, {cfg.state_bytes / 1e6:,.1f} MB each"
    return f"; model {cfg.layers_pattern}{window}{states}"


def _headline(path: str, trace: Trace, cfg: ReplayConfig) -> str:
    skipped = f", {trace.skipped} bad line(s) skipped" if trace.skipped else ""
    return (
        f"hicache replay {path}: {len(trace.requests):,} requests{skipped}; device "
        f"{cfg.device_slots:,} tokens, {_tiers(cfg)}, page {cfg.page_size}, {cfg.device} "
        f"({cfg.token_bytes} B/token){_model(cfg)}"
    )


def run_command(args: argparse.Namespace, out: TextIO) -> int:
    """One replay or a sweep; 130 when interrupted, else 0."""
    events = _events(args)
    trace = _trace(args)
    if args.generate_only:
        out.write(f"trace: {args.trace} ({len(trace.requests):,} requests)\n")
        return 0
    base = ReplayConfig.from_args(vars(args))
    threads = args.threads if args.threads is not None else 1 if base.device == "cpu" else None
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be positive, got {threads}")
        torch.set_num_threads(threads)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"trace": args.trace, "skipped_lines": trace.skipped}
    if args.sweep:
        return _sweep(args, trace, base, out_dir, meta, out)
    out.write(_headline(args.trace, trace, base) + "\n")
    run = _one(trace, base, "replay", args, events=make_sink(events))
    summary = summarize(run)
    out.write(format_summary(summary) + "\n")
    path = _write(out_dir, "replay.json", {**meta, "config": base.to_dict(), **summary})
    title = _headline(args.trace, trace, base).replace("; ", "\n", 1)
    why = plot_replay(out_dir / "replay.png", run.records, f"{title}\n{traffic_line(summary)}")
    out.write(
        f"results: {path}\n" + (f"note: {why}\n" if why else f"plot:    {out_dir / 'replay.png'}\n")
    )
    return 130 if run.interrupted else 0


def _sweep(
    args: argparse.Namespace,
    trace: Trace,
    base: ReplayConfig,
    out_dir: Path,
    meta: dict[str, Any],
    out: TextIO,
) -> int:
    grid = parse_sweep(args.sweep)
    points = grid_points(grid)
    configs = sweep_configs(base, points)
    cost = sweep_cost(configs)
    out.write(_headline(args.trace, trace, base) + f"\nsweep {grid} ({len(points)} replays)\n")
    out.write(f"bandwidth {describe_bandwidth(cost)}, the same for every point\n")
    states = has_states(configs)
    out.write(sweep_header(grid, states) + "\n")
    summaries = []
    for point, cfg in zip(points, configs, strict=True):
        label = " ".join(f"{k}={v}" for k, v in point.items())
        run = _one(trace, cfg, label, args, cost)
        summary = summarize(run)
        summaries.append(
            {
                **point,
                "total_capacity_tokens": total_capacity(cfg),
                "config": cfg.to_dict(),
                **summary,
            }
        )
        out.write(sweep_row(point, cfg, summary, states) + "\n")
        if run.interrupted:
            break
    path = _write(out_dir, "sweep.json", {**meta, "sweep": grid, "runs": summaries})
    why = plot_sweep(out_dir / "sweep.png", grid, summaries)
    out.write(
        f"results: {path}\n" + (f"note: {why}\n" if why else f"plot:    {out_dir / 'sweep.png'}\n")
    )
    return 130 if summaries[-1]["interrupted"] else 0


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    try:
        return run_command(args, out if out is not None else sys.stdout)
    except (ValueError, TypeError, OSError) as err:
        sys.stderr.write(f"hicache replay: error: {err}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("\nhicache replay: interrupted before the replay started\n")
        return 130
