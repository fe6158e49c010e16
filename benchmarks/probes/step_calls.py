"""Python function calls per prefill step with a host hit, inside the cache's calls.

The step of ``bench_control_plane.py`` (TP 1, CPU): one request whose 1,024-token prefix is a
host-only hit, finished in the step. Counts every Python-level call (``sys.setprofile``) made
inside the calls ``_cache_meter`` meters (the cache's, its allocator's and request table's),
outside the spans that copy KV (the CPU figure subtracts those), per metered call and in all.
A deterministic figure, unlike the noisy microseconds of a shared box: on the scheduler's path
each such call costs ~0.7-1 us of a step (the forward and the copies leave the caches cold).

    python benchmarks/probes/step_calls.py [--steps 20]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_control_plane as bench  # noqa: E402
from _cache_meter import CACHE_CALLS, POOL_CALLS  # noqa: E402

# inside the copy spans (``BusyClock`` begin..end): the batch's backend, indices, plan and copy
COPIES = {
    "batch_backend",
    "transfer_indices",
    "backup_from_device_all_layer",
    "plan_load",
    "through",
}


class CallCounter:
    """Python calls per metered call of ``engine`` while ``on``, outside the copy spans."""

    def __init__(self, engine: Any) -> None:
        self.on, self.counts = False, collections.Counter[str]()
        self._outer: str | None = None
        self._copying = 0
        for part, names in (
            (engine.cache, CACHE_CALLS),
            (engine.allocator, POOL_CALLS),
            (engine.req_to_token_pool, POOL_CALLS),
        ):
            for name in names:
                if hasattr(part, name):
                    label = f"{type(part).__name__}.{name}"
                    setattr(part, name, self._counted(getattr(part, name), label))

    def _counted(self, call: Any, name: str) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if not self.on or self._outer is not None:
                return call(*args, **kwargs)
            self._outer = name
            sys.setprofile(self._profile)
            try:
                return call(*args, **kwargs)
            finally:
                sys.setprofile(None)
                self._outer = None

        return counted

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        name = frame.f_code.co_name
        if event == "call":
            self._copying += name in COPIES
            if not self._copying and self._outer is not None:
                self.counts[self._outer] += 1
        elif event == "return" and name in COPIES:
            self._copying -= 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    steps = parser.parse_args().steps
    torch.set_num_threads(1)
    s = bench.Settings("cpu", steps, 8, 1024, 16, 16, "auto")
    engine = bench.build(None, s)
    counter = CallCounter(engine)
    prefixes = [bench.prompt(i, s.prefix) for i in range(bench.PREFIXES)]
    for p in prefixes:
        engine.submit(p, 1)
    engine.run()
    for i in range(steps + 2):
        counter.on = False
        bench.offload(engine)
        engine.submit(prefixes[i % bench.PREFIXES] + bench.prompt(-1 - i, s.new), 1)
        counter.on = i >= 2  # two warm-up steps
        engine.step()
    print(f"{'call':40s} {'python calls / step':>20s}")
    for name, n in counter.counts.most_common():
        print(f"{name:40s} {n / steps:20.1f}")
    print(f"{'all':40s} {sum(counter.counts.values()) / steps:20.1f}")


if __name__ == "__main__":
    main()
