"""One replay end to end: trace -> requests -> real stack -> records and the cache's counters."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hicache.metrics import serving
from hicache.radix.events import EventSink
from hicache.radix.stats import CacheStats
from hicache.replay.config import ReplayConfig
from hicache.replay.cost import CostModel, measure_bandwidth
from hicache.replay.driver import Replayer
from hicache.replay.hybrid import state_slots
from hicache.replay.ideal import block_ideal_hits, ideal_hits
from hicache.replay.live import LiveRequest, Record
from hicache.replay.memory import MemoryFigures, measure, rss_bytes
from hicache.replay.states import StateFigures
from hicache.replay.trace import Trace
from hicache.stack import KVStack


@dataclass
class ReplayRun:
    """A finished (or interrupted) replay: its records, the cache's counters at the end
    (``stats``), the clock, what it held in RAM (``memory``); ``block_ideal``: each
    request's block ideal (by rid); ``states``: a recurrent model's states (else None)."""

    config: ReplayConfig
    cost: CostModel
    records: list[Record]
    stats: CacheStats
    ideal_total: int
    total_requests: int
    modelled_s: float
    wall_s: float
    interrupted: bool = False
    memory: MemoryFigures | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    block_ideal: list[int] = field(default_factory=list)
    states: StateFigures | None = None


def cost_model(cfg: ReplayConfig) -> CostModel:
    """The flags' compute model; the bandwidths from the flags, else measured."""
    h2d, d2h = cfg.h2d_gbps, cfg.d2h_gbps
    measured = cfg.host_ratio > 0 and (h2d is None or d2h is None)
    mh2d, md2h = measure_bandwidth(cfg) if measured else (0.0, 0.0)
    return CostModel(
        prefill_tps=cfg.prefill_tps,
        decode_step_s=cfg.decode_step_ms / 1e3,
        h2d_bytes_per_s=h2d * 1e9 if h2d is not None else mh2d,
        d2h_bytes_per_s=d2h * 1e9 if d2h is not None else md2h,
        measured=measured,
        storage_bytes_per_s=cfg.storage_gbps * 1e9 if cfg.storage != "none" else 0.0,
    )


def live_requests(trace: Trace, page_size: int) -> list[LiveRequest]:
    reqs, ideal = trace.requests, ideal_hits(trace.requests, trace.block_tokens, page_size)
    t0 = reqs[0].timestamp_ms
    return [
        LiveRequest(i, r, (r.timestamp_ms - t0) / 1e3, ideal[i], trace.block_tokens)
        for i, r in enumerate(reqs)
    ]


@contextmanager
def built_stack(
    cfg: ReplayConfig, max_context_len: int, events: EventSink | None
) -> Iterator[KVStack]:
    """``cfg``'s stack, closed at the end (its storage threads stopped); the file store lives
    in a temporary directory, removed then."""
    with tempfile.TemporaryDirectory(prefix="hicache-replay-") as root:
        stack = cfg.build_stack(max_context_len, kv_events=events, storage_root=root)
        try:
            yield stack
        finally:
            stack.close()


def replay(
    trace: Trace,
    cfg: ReplayConfig,
    on_record: Callable[[Record], None] | None = None,
    cost: CostModel | None = None,
    events: EventSink | None = None,
    *,
    check_invariants: bool = True,
) -> ReplayRun:
    """Replay ``trace`` under ``cfg`` (the cache's KV events to ``events``). Ctrl-C stops it
    and returns what was measured so far (``interrupted``); ``ValueError`` before any work
    when ``cfg`` does not fit the trace. ``check_invariants``: check the whole cache at the end
    (it joins, sorts and compares every slot: a peak several times the tree on a large run)."""
    if cfg.block_tokens != trace.block_tokens:
        raise ValueError(
            f"block_tokens={cfg.block_tokens} but the trace was read with {trace.block_tokens}"
        )
    cost = cost or cost_model(cfg)
    start_rss = rss_bytes()
    longest = max(r.input_length + r.output_length for r in trace.requests)
    with built_stack(cfg, longest + cfg.page_size, events) as stack:
        return _run(trace, cfg, cost, stack, on_record, check_invariants, start_rss)


def _run(
    trace: Trace,
    cfg: ReplayConfig,
    cost: CostModel,
    stack: KVStack,
    on_record: Callable[[Record], None] | None,
    check_invariants: bool,
    start_rss: int,
) -> ReplayRun:
    driver = Replayer(
        stack,
        cost,
        max_running=cfg.max_running,
        max_prefill_tokens=cfg.max_prefill_tokens,
        token_bytes=cfg.token_bytes,
        state_bytes=cfg.state_bytes,
    )
    requests = live_requests(trace, cfg.page_size)
    start, interrupted = time.perf_counter(), False
    labels = {"run": f"replay device_tokens={cfg.device_tokens} host_ratio={cfg.host_ratio:g}"}
    with serving(stack.cache, cfg.metrics_port, cfg.metrics_host, labels):
        try:
            driver.run(requests, on_record)
        except KeyboardInterrupt:
            interrupted = True
    wall = time.perf_counter() - start
    if not interrupted:
        stack.cache.drain_transfers()  # the last batches land: their busy time counts
        if check_invariants:
            stack.cache.check_invariants()
    ideal = sum(r.ideal_hit for r in driver.records)
    return ReplayRun(
        cfg,
        cost,
        driver.records,
        stack.cache.stats(),
        ideal,
        len(requests),
        driver.now,
        wall,
        interrupted,
        block_ideal=block_ideal_hits(trace.requests, trace.block_tokens),
        memory=measure(stack, start_rss),
        states=None
        if driver.states is None
        else driver.states.figures(cfg.state_bytes, state_slots(cfg)),
    )
