"""Microseconds per metered call of the prefill step with a host hit, by call.

The step of ``bench_control_plane.py`` (TP 1) on ``--device``: one request whose 1,024-token
prefix is a host-only hit, finished in the step. Every call ``_cache_meter`` meters (the
cache's, its allocator's and request table's) is timed on its own (outermost calls only), less
the busy time of the KV copies it ran inline (CPU), and printed as a mean per step. The steps'
``offload`` (drain, evict) is outside the step and left out.

    python benchmarks/probes/call_us.py [--device cuda] [--steps 300]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_control_plane as bench  # noqa: E402
from _cache_meter import metered_calls  # noqa: E402


class CallClock:
    """Per-call seconds (less inline copy time) and counts, while ``on``."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.on, self.depth = engine, False, 0
        self.seconds: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        for part, name, label in metered_calls(engine):
            if not label.startswith("tp."):
                setattr(part, name, self._timed(getattr(part, name), label))

    def _timed(self, call: Callable[..., Any], label: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.depth += 1
            copies, start = bench.copy_seconds(self.engine), time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0 and self.on:
                    took = time.perf_counter() - start
                    self.seconds[label] += took - (bench.copy_seconds(self.engine) - copies)
                    self.calls[label] += 1

        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=300)
    a = parser.parse_args()
    torch.set_num_threads(1)
    s = bench.Settings(a.device, a.steps, 8, 1024, 16, 16, "auto")
    engine = bench.build(None, s)
    clock = CallClock(engine)
    prefixes = [bench.prompt(i, s.prefix) for i in range(bench.PREFIXES)]
    for p in prefixes:
        engine.submit(p, 1)
    engine.run()
    for i in range(a.steps + 20):
        bench.offload(engine)
        engine.submit(prefixes[i % bench.PREFIXES] + bench.prompt(-1 - i, s.new), 1)
        clock.on = i >= 20
        engine.step()
        clock.on = False
    total = sum(clock.seconds.values())
    print(f"{'call':<36} {'us/step':>8} {'calls':>6}   ({a.device}, {a.steps} steps)")
    for label, sec in clock.seconds.most_common():
        print(f"{label:<36} {1e6 * sec / a.steps:>8.1f} {clock.calls[label] / a.steps:>6.2f}")
    print(f"{'all':<36} {1e6 * total / a.steps:>8.1f}")


if __name__ == "__main__":
    main()
