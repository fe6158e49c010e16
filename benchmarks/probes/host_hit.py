"""What the step probes share: the prefill step with a host hit of ``bench_control_plane.py``
(TP 1), run ``steps`` times after ``warmup`` steps, and the CPU cost of a call.

Each step submits one request whose 1,024-token prefix is a host-only hit (backed up, then
evicted from the device by ``bench.offload`` before the step) plus 16 new tokens; the request
finishes in the step.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_control_plane as bench  # noqa: E402


def engine_on(device: str, steps: int) -> Any:
    """The probed engine on ``device`` (one thread), sized for ``steps`` steps."""
    torch.set_num_threads(1)
    return bench.build(None, bench.Settings(device, steps, 8, 1024, 16, 16, "auto"))


def run_steps(engine: Any, steps: int, measure: Callable[[bool], None], warmup: int = 2) -> None:
    """Fill the host with the prefixes, then ``warmup + steps`` host-hit steps;
    ``measure(True)`` right before each measured ``engine.step()``, ``measure(False)`` after
    each step (and around the offload that precedes it)."""
    prefixes = [bench.prompt(i, 1024) for i in range(bench.PREFIXES)]
    for p in prefixes:
        engine.submit(p, 1)
    engine.run()
    for i in range(warmup + steps):
        bench.offload(engine)
        engine.submit(prefixes[i % bench.PREFIXES] + bench.prompt(-1 - i, 16), 1)
        if i >= warmup:
            measure(True)
        engine.step()
        measure(False)


def us_per_call(fn: Callable[[], object], calls: int = 256, repeats: int = 15) -> float:
    """Median microseconds of CPU per ``fn()`` on CUDA (the GPU idle at the start of each
    repeat)."""
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)
