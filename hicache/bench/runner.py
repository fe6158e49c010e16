"""The main job: one chat workload through the engine, device-only and then with the host tier
(on ``--tp`` ranks: ``bench.tp_run``)."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import torch

from hicache.bench.config import BenchConfig
from hicache.bench.model_flags import keeps_states, state_plan
from hicache.bench.plot import plot_rounds
from hicache.bench.progress import ProgressBar
from hicache.bench.report import format_gain, format_table, per_round, summarize
from hicache.bench.states import StatePeaks, format_states
from hicache.bench.tp_run import run_tp, tp_line
from hicache.bench.workload import ChatWorkload, drive
from hicache.engine import Engine, build_engine
from hicache.kv_events import make_sink
from hicache.metrics import serving
from hicache.model import TinyTransformer, TPShard
from hicache.radix.events import EventSink

MODES = {"device-only": "radix", "host-tier": "hiradix"}
OUTPUTS = ("results.json", "rounds.png")  # what a run writes to --out-dir


def run_mode(
    model: TinyTransformer,
    cfg: BenchConfig,
    kind: str,
    label: str,
    progress: bool,
    events: EventSink | None = None,
) -> dict[str, Any]:
    """Run the workload once with cache ``kind`` (its KV events to ``events``); returns its
    summary and per-round series."""
    engine = build_engine(model, cfg.cache_spec(kind, kv_events=events), cfg.engine_config())
    return measure(engine, cfg, label, progress)


def measure(
    engine: Engine, cfg: BenchConfig, label: str, progress: bool, cache_salt: str | None = None
) -> dict[str, Any]:
    """Run the workload once through ``engine`` (its requests salted with ``cache_salt``),
    then drain its transfers; the summary counts only this run's transfers and storage
    traffic, the recurrent states held (a model with ``L`` layers: ``bench.states``, seen after
    every step), and the per-round series."""
    before = engine.cache.stats()
    peaks = StatePeaks(before) if keeps_states(cfg) else None
    bar = ProgressBar(cfg.users * cfg.rounds, label) if progress else None

    def tick(record: Any) -> None:
        if bar is not None:
            bar.update(note=f"round {record.round + 1}/{cfg.rounds}")

    with serving(engine.cache, cfg.metrics_port, cfg.metrics_host, {"run": label}):
        observe = None if peaks is None else lambda: peaks.observe(engine.cache.stats())
        records, wall = drive(engine, ChatWorkload(cfg), tick, cache_salt, observe)
        if bar is not None:
            bar.close()
        engine.cache.drain_transfers()  # the last batches land: their busy time counts
    engine.cache.check_invariants()
    stats = engine.cache.stats()
    summary = summarize(records, wall, stats, before)
    if peaks is not None:
        summary |= peaks.summary(stats)
    return {"summary": summary, "rounds": per_round(records, cfg.rounds)}


def warm_up(model: TinyTransformer, cfg: BenchConfig) -> None:
    """Exercise both modes on a tiny workload (kernel compiles, allocator warm-up, load-back)."""
    small = BenchConfig(
        **{
            **cfg.to_dict(),
            "users": 3,
            "rounds": 2,
            "system_len": 16,
            "prompt_len": 24,
            "answer_len": 2,
            "device_tokens": 96,
        }
    )
    for kind in MODES.values():
        engine = build_engine(model, small.cache_spec(kind), small.engine_config())
        drive(engine, ChatWorkload(small))


def run_bench(cfg: BenchConfig, progress: bool = True, out: TextIO | None = None) -> dict[str, Any]:
    """Run both modes, print the table, write ``results.json`` and ``rounds.png`` to ``out_dir``.

    ``ValueError`` (before any work) when ``out_dir`` cannot be created or the pools do not fit
    in memory.
    """
    out = out if out is not None else sys.stdout
    out_dir = prepare_out_dir(cfg)
    modes = MODES
    if cfg.tp > 1:
        results = run_tp(run_modes, cfg, progress, list(modes))
    else:
        with torch_threads(cfg.threads):
            results = run_modes(cfg, progress)
    summaries = {m: results[m]["summary"] for m in modes}
    (out_dir / "results.json").write_text(json.dumps(finite(results), indent=2, allow_nan=False))
    why = plot_rounds(
        out_dir / "rounds.png", {m: results[m] for m in modes}, headline(cfg, results["device"])
    )
    out.write(headline(cfg, results["device"]) + "\n\n" + format_table(summaries) + "\n\n")
    out.write(format_gain(summaries["device-only"], summaries["host-tier"]) + "\n")
    if keeps_states(cfg):
        out.write(format_states(results["state_plan"], summaries, cfg.state_bytes) + "\n")
    out.write(
        "".join(
            f"note: {m}: {s['rejected']} request(s) rejected, e.g. {s['first_error']}\n"
            for m, s in summaries.items()
            if s["rejected"]
        )
    )
    if cfg.tp > 1:
        out.write(tp_line(cfg, results))
    plot = f"note: {why}" if why else f"plot:    {out_dir / 'rounds.png'}"
    out.write(f"results: {out_dir / 'results.json'}\n{plot}\n")
    return results


def prepare_out_dir(cfg: BenchConfig) -> Path:
    """``cfg.out_dir``, created, without an earlier run's ``OUTPUTS`` (a storage run writes no
    PNG; a run without matplotlib neither); ``ValueError`` when it cannot be created or the
    pools do not fit in memory (``check_memory``)."""
    out_dir = Path(cfg.out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--out-dir {cfg.out_dir}: cannot create it ({err.strerror})") from err
    cfg.check_memory()
    for name in OUTPUTS:
        (out_dir / name).unlink(missing_ok=True)
    return out_dir


def run_modes(cfg: BenchConfig, progress: bool, group: Any = None) -> dict[str, Any]:
    """Both modes on a fresh model; ``group``: this rank's TP process group (None: one rank),
    the model holding its shard and the caches agreeing over it."""
    model = TinyTransformer(cfg.model_config(), cfg.device, TPShard.of(group))
    warm_up(model, cfg)
    results: dict[str, Any] = {"config": cfg.to_dict(), "device": device_name(cfg.device)}
    if keeps_states(cfg):
        results["state_plan"] = state_plan(cfg.cache_spec("radix"))
    events = make_sink(cfg.events_config())  # one stream: each run's cache clears it first
    try:
        for label, kind in MODES.items():
            results[label] = run_mode(model, cfg, kind, label, progress, events)
            gc.collect()
            if cfg.device.startswith("cuda"):
                torch.cuda.empty_cache()
    finally:
        if events is not None:
            getattr(events, "close")()  # noqa: B009 (the ZmqEventPublisher made here)
    return results


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the body with ``threads`` torch intra-op threads (None: unchanged), then restore."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (a percentile of no samples) replaced by None, so
    the file is strict JSON."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"


def headline(cfg: BenchConfig, device: str) -> str:
    model = cfg.model_config()
    pattern = f" {cfg.layers_pattern} (window {model.sliding_window})" if cfg.hybrid else ""
    return (
        f"hicache bench on {device}: {cfg.users} users x {cfg.rounds} rounds, system prompt "
        f"{cfg.system_len}, +{cfg.prompt_len} prompt / {cfg.answer_len} answer tokens per round; "
        f"model {cfg.layers}L{pattern} {cfg.heads}H/{cfg.kv_heads}KV x {cfg.head_dim} {cfg.dtype} "
        f"({cfg.attention}); device pool {cfg.device_tokens} tokens, host x{cfg.host_ratio:g}"
        + (f"; TP {cfg.tp} ranks (each its shard of heads, MLP and KV)" if cfg.tp > 1 else "")
    )
