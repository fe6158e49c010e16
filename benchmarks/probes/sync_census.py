"""Device->host syncs on the engine's scheduler path (CUDA): where they are.

Runs the scheduler steps of a ``HiRadixCache`` engine on CUDA (a prefill whose prefix is a host
hit, decode steps, the finish: frees, insert, backup issue) under
``torch.cuda.set_sync_debug_mode``, the model's forward and the copy of its logits to the host
excluded (``HostLogits``). With ``warn`` (this script) it prints each distinct hicache frame that
synchronized, most frequent first; ``tests/engine/test_engine_nosync_gpu.py`` runs the same steps
with ``error``.

    python benchmarks/probes/sync_census.py
"""

from __future__ import annotations

import collections
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hicache.engine import CacheSpec, Engine, EngineConfig, Status, build_engine  # noqa: E402
from hicache.model import ModelConfig, TinyTransformer  # noqa: E402
from hicache.radix import HiCacheConfig  # noqa: E402

PREFIX, NEW, DECODE = 256, 16, 4


class HostLogits:
    """The model, run with sync checks off, returning its logits on the host: the model and the
    sampler's copy are not the scheduler's part."""

    def __init__(self, model: Any, mode: str) -> None:
        self.model, self.mode = model, mode

    def __call__(self, *args: Any) -> torch.Tensor:
        torch.cuda.set_sync_debug_mode(0)
        try:
            return self.model(*args).cpu()
        finally:
            torch.cuda.set_sync_debug_mode(self.mode)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def build(mode: str) -> Engine:
    """A write-through ``HiRadixCache`` engine on CUDA whose model is wrapped in ``HostLogits``."""
    model = TinyTransformer(ModelConfig(num_layers=2), "cuda")
    spec = CacheSpec(
        kind="hiradix",
        device_tokens=4096,
        page_size=16,
        max_context_len=1024,
        max_requests=8,
        hicache=HiCacheConfig(hicache_ratio=4.0, load_back_threshold=1),
    )
    engine = build_engine(model, spec, EngineConfig(max_prefill_tokens=1024))
    engine.model = HostLogits(model, mode)  # type: ignore[assignment]
    return engine


def scheduler_steps(engine: Engine, mode: str) -> None:
    """Cache a prefix, back it up and evict it (sync checks off), then run the steps of a
    request that hits it on the host with ``set_sync_debug_mode(mode)``."""
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 256, (PREFIX,), generator=g).tolist()
    for n in (PREFIX, PREFIX + 1):  # the second warms up a load-back and a decode
        engine.submit(prefix[:n] + [1, 2], DECODE)
        engine.run()
    engine.cache.drain_transfers()
    engine.cache.check_hicache_events()
    engine.cache.evict(engine.allocator.size)
    req = engine.submit(prefix + torch.randint(0, 256, (NEW,), generator=g).tolist(), DECODE)
    torch.cuda.set_sync_debug_mode(mode)
    try:
        while engine.has_work():
            engine.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert req.status is Status.FINISHED and req.host_hit > 0, (req.status, req.host_hit)


def hicache_frame(stack: list[traceback.FrameSummary]) -> str:
    frames = [f for f in stack if "/hicache/" in f.filename]
    f = frames[-1] if frames else stack[-1]
    return f"{f.filename.split('/hicache/')[-1]}:{f.lineno} {f.name}: {f.line}"


def census() -> collections.Counter[str]:
    """Each hicache frame that synchronized in ``scheduler_steps``, with its count."""
    sites: collections.Counter[str] = collections.Counter()

    def note(message: Any, *args: Any, **kwargs: Any) -> None:
        sites[hicache_frame(traceback.extract_stack()[:-1])] += 1

    with warnings.catch_warnings():  # restores showwarning on exit
        warnings.simplefilter("always")
        warnings.showwarning = note
        scheduler_steps(build("warn"), "warn")
    return sites


def main() -> None:
    sites = census()
    print(f"{sum(sites.values())} syncs at {len(sites)} sites on the scheduler path")
    for site, count in sites.most_common():
        print(f"{count:>4}  {site}")


if __name__ == "__main__":
    main()
