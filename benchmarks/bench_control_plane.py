"""Control-plane CPU per scheduler step: what the cache costs the engine's step, model excluded.

Two steps of a ``HiRadixCache`` engine (write-through host tier), at TP 1, 2 and 4 (ranks are
processes over loopback gloo; on CUDA only TP 1):

- **decode**: ``--batch`` requests decoding one token each (page allocation every
  ``page_size`` tokens, the TP agreements of the step);
- **prefill, host hit**: one request whose ``--prefix`` tokens are on the host only (backed up,
  then evicted from the device), plus ``--new`` tokens; the one step matches, locks, allocates,
  issues the load-back, prefills, finishes, frees, inserts and issues the backup.

Two figures per step, both without the model's forward (timed by a wrapper around the model;
on CUDA it synchronizes inside the wrapper, so the sampling copy that follows does not wait)
and, on CPU, without the busy time of the KV copies (``cache.stats().transfer``: on CPU they run
inline on the scheduler thread, on a GPU on the copy streams):

- **cache us**, the target's figure: wall time inside the cache's calls, its pools' (allocation,
  free, request-table writes) and its TP agreements (``_cache_meter.CacheMeter``);
- **engine us**: the whole step's wall time, so also the engine's scheduling loop, building the
  model's batch (``ForwardBatch.build``) and sampling (``argmax().tolist()`` of ``[batch, 256]``
  logits): the model runner's and scheduler's work in a serving engine, not the cache's.

Under TP a step costs what its slowest rank spent, so each sample is the maximum over ranks. The
table compares with SGLang's published per-step cost of its HiCache TP agreement: 0.6-3.2 ms (a
gloo all-reduce per step, sgl-project/sglang#39903; four all-reduces of ~150 us per decode step,
#30511).

    python benchmarks/bench_control_plane.py                  # CPU, TP 1,2,4
    python benchmarks/bench_control_plane.py --device cuda --tp 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from _cache_meter import CacheMeter
from _common import import_hicache

engine_mod = import_hicache("engine")
model_mod = import_hicache("model")
radix_mod = import_hicache("radix")
tp_mod = import_hicache("tp")

SGLANG_MS = "0.6-3.2 ms"  # sgl-project/sglang#39903 and #30511, per step
TARGET_US = 100.0
STEPS = ("decode", "prefill host hit")
PREFIXES = 4  # distinct host-hit prefixes the prefill samples cycle through


@dataclass(frozen=True)
class Settings:
    device: str
    steps: int
    batch: int
    prefix: int
    new: int
    page_size: int
    transport: str

    @property
    def device_tokens(self) -> int:
        return 4 * self.steps * self.page_size + PREFIXES * 2 * (self.prefix + self.new)


class TimedModel:
    """The model, timing each forward (seconds in ``spent``); everything else forwards."""

    def __init__(self, model: Any) -> None:
        self.model, self.spent = model, 0.0

    def __call__(self, *args: Any) -> torch.Tensor:
        start = time.perf_counter()
        logits = self.model(*args)
        if logits.is_cuda:
            torch.cuda.synchronize(logits.device)
        self.spent += time.perf_counter() - start
        return logits

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def build(group: Any, s: Settings) -> Any:
    """An engine on this rank's shard of a tiny model (4 KV heads x 16, 2 layers, fp32)."""
    cfg = model_mod.ModelConfig(num_heads=4, num_kv_heads=4, num_layers=2)
    model = model_mod.TinyTransformer(cfg, s.device, model_mod.TPShard.of(group))
    spec = engine_mod.CacheSpec(
        kind="hiradix",
        device_tokens=s.device_tokens,
        page_size=s.page_size,
        max_context_len=4 * (s.prefix + s.new + s.steps),
        max_requests=2 * s.batch + 4,
        hicache=radix_mod.HiCacheConfig(hicache_ratio=4.0, load_back_threshold=1),
    )
    config = engine_mod.EngineConfig(
        max_running_requests=2 * s.batch, max_prefill_tokens=4 * (s.prefix + s.new)
    )
    tp = None if group is None else tp_mod.TPGroup(group, transport=s.transport)
    engine = engine_mod.build_engine(model, spec, config, tp_group=tp)
    engine.model = TimedModel(model)
    return engine


def copy_seconds(engine: Any) -> float:
    """Busy seconds of the host tier's KV copies so far; only where they run inline (CPU)."""
    t = engine.cache.cache_controller.counters
    return t.h2d.settle() + t.d2h.settle() if engine.model.device.type == "cpu" else 0.0


class Sample(NamedTuple):
    """One step: control-plane microseconds of the cache (``agree_us`` of them in TP
    agreements) and of the whole engine step (both without the model's forward and the inline
    KV copies), and the TP collectives issued."""

    cache_us: float
    agree_us: float
    engine_us: float
    collectives: int


def timed_step(engine: Any, meter: CacheMeter) -> Sample:
    """One ``engine.step()``, timed."""
    model, copies, coll = engine.model.spent, copy_seconds(engine), engine.tp.collectives
    inside, agreeing = meter.seconds, meter.agree_seconds
    start = time.perf_counter()
    engine.step()
    wall = time.perf_counter() - start
    copy = copy_seconds(engine) - copies
    cache = meter.seconds - inside - copy
    spent = wall - (engine.model.spent - model) - copy
    agree = meter.agree_seconds - agreeing
    return Sample(1e6 * cache, 1e6 * agree, 1e6 * spent, engine.tp.collectives - coll)


def prompt(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g).tolist()


def decode_samples(engine: Any, meter: CacheMeter, s: Settings) -> list[Sample]:
    """``s.steps`` timed decode steps of ``s.batch`` requests (after their prefill and 4 more
    steps, so the prompts' backups are done)."""
    for i in range(s.batch):
        engine.submit(prompt(10_000 + i, s.prefix), s.steps + 8)
    sched = engine.scheduler
    while sched.waiting or any(r.status is not engine_mod.Status.DECODE for r in sched.active):
        engine.step()
    for _ in range(4):
        engine.step()
    samples = [timed_step(engine, meter) for _ in range(s.steps)]
    engine.run()
    return samples


def offload(engine: Any) -> None:
    """Wait for backups, then evict every unlocked device entry (backed up: kept on the host)."""
    engine.cache.drain_transfers()
    engine.cache.check_hicache_events()
    engine.cache.evict(engine.allocator.size)


def prefill_samples(engine: Any, meter: CacheMeter, s: Settings) -> list[Sample]:
    """``s.steps`` timed steps, each one request whose ``s.prefix`` tokens are a host hit."""
    prefixes = [prompt(i, s.prefix) for i in range(PREFIXES)]
    for p in prefixes:
        engine.submit(p, 1)
    engine.run()
    samples: list[Sample] = []
    for i in range(s.steps + 2):
        offload(engine)
        req = engine.submit(prefixes[i % PREFIXES] + prompt(-1 - i, s.new), 1)
        took = timed_step(engine, meter)
        assert req.status is engine_mod.Status.FINISHED, req.status
        assert req.host_hit >= s.prefix - s.page_size, f"no host hit: {req.host_hit}"
        if i >= 2:  # two warm-up steps
            samples.append(took)
    return samples


def rank_run(group: Any, s: Settings) -> dict[str, Any]:
    """One rank's samples of both steps."""
    torch.set_num_threads(1)
    engine = build(group, s)
    meter = CacheMeter(engine)
    return {
        "decode": decode_samples(engine, meter, s),
        "prefill host hit": prefill_samples(engine, meter, s),
        "channel": engine.cache.tp.channel,
    }


def measure(tp: int, s: Settings) -> tuple[dict[str, Any], str | None]:
    """Samples per step kind, each step's microseconds the slowest rank's; the agreements'
    channel (None at TP 1)."""
    ranks = [rank_run(None, s)] if tp == 1 else tp_mod.run_ranks(rank_run, tp, s, timeout_s=600)
    return {name: slowest([r[name] for r in ranks]) for name in STEPS}, ranks[0]["channel"]


def slowest(ranks: list[list[Sample]]) -> list[Sample]:
    """Per step: the slowest rank's microseconds (each figure's own slowest), rank 0's
    collectives."""
    return [
        Sample(*(max(r[i] for r in step) for i in range(3)), step[0].collectives)
        for step in zip(*ranks, strict=True)
    ]


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def table(rows: list[tuple[int, str, list[Sample]]]) -> str:
    """Cache median and p90, its agreements' median, the cache without them, engine-step
    median (all us), collectives per step, verdict."""
    head = (
        f"{'TP':>3} {'step':<17} {'cache us':>9} {'p90':>7} {'agree us':>8} {'own us':>7} "
        f"{'engine us':>10} {'coll/step':>9}  vs SGLang"
    )
    lines = [head, "-" * len(head)]
    for tp, name, samples in rows:
        cache = [r.cache_us for r in samples]
        med = statistics.median(cache)
        agree = statistics.median(r.agree_us for r in samples)
        own = statistics.median(r.cache_us - r.agree_us for r in samples)
        engine = statistics.median(r.engine_us for r in samples)
        coll = sum(r.collectives for r in samples) / len(samples)
        ok = "under" if med < TARGET_US else "OVER"
        lines.append(
            f"{tp:>3} {name:<17} {med:>9.1f} {p90(cache):>7.1f} {agree:>8.1f} {own:>7.1f} "
            f"{engine:>10.1f} {coll:>9.2f}  "
            f"{SGLANG_MS} ({ok} {TARGET_US:.0f} us target)"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tp", default="1,2,4", help="comma-separated TP sizes (default 1,2,4)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--steps", type=int, default=200, help="timed steps of each kind")
    p.add_argument("--batch", type=int, default=8, help="decoding requests")
    p.add_argument("--prefix", type=int, default=1024, help="host-hit tokens of a prefill")
    p.add_argument("--new", type=int, default=16, help="computed tokens of a prefill")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument(
        "--transport",
        default="auto",
        choices=tp_mod.TRANSPORTS,
        help="the TP agreement's channel: auto (shared memory on one host) or group (gloo)",
    )
    a = p.parse_args()
    s = Settings(a.device, a.steps, a.batch, a.prefix, a.new, a.page_size, a.transport)
    sizes = [int(t) for t in a.tp.split(",")]
    if a.device == "cuda" and sizes != [1]:
        p.error("--device cuda runs TP 1 only (ranks here are CPU processes over gloo)")
    rows, channels = [], []
    for tp in sizes:
        steps, channel = measure(tp, s)
        rows += [(tp, name, samples) for name, samples in steps.items()]
        if channel is not None:
            channels.append(f"TP {tp} through {channel}")
    print(table(rows))
    if channels:
        print("agreements: " + ", ".join(channels))


if __name__ == "__main__":
    main()
