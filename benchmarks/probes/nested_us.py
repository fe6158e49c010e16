"""Microseconds per prefill step with a host hit inside chosen functions (inclusive, no profiler).

The step of ``bench_control_plane.py`` (TP 1; ``host_hit.py``) on ``--device``, the cache's
calls and on the CPU the KV copies they run inline included. Each named function
(``module:Qualified.name``) is wrapped where it is defined and wherever a hicache module imported
it by name, and timed (wall, inclusive, its nested calls of itself counted once) while the step
runs: a breakdown without cProfile's per-call inflation (~0.3 us per wrapped call).

    python benchmarks/probes/nested_us.py [--device cuda] [--steps 300] \
        hicache.controller.issue:issue_write hicache.pools.host_pool:HostKVPool._prepare ...
"""

from __future__ import annotations

import argparse
import collections
import importlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from host_hit import engine_on, run_steps  # noqa: E402


class Timers:
    """Inclusive seconds and calls per wrapped function while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.seconds: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self._active: collections.Counter[str] = collections.Counter()

    def wrap(self, target: str) -> None:
        module_name, qualname = target.split(":")
        owner: Any = importlib.import_module(module_name)
        *path, name = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        timed = self._timed(original, qualname)
        setattr(owner, name, timed)
        if not isinstance(owner, type):  # a module function: also where imported by name
            for module in list(sys.modules.values()):
                if getattr(module, "__name__", "").startswith("hicache") and (
                    module.__dict__.get(name) is original
                ):
                    setattr(module, name, timed)

    def _timed(self, call: Callable[..., Any], label: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on or self._active[label]:
                return call(*args, **kwargs)
            self._active[label] += 1
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start
                self.calls[label] += 1
                self._active[label] -= 1

        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("targets", nargs="+", help="module:Qualified.name")
    a = parser.parse_args()
    timers = Timers()
    for target in a.targets:
        timers.wrap(target)
    engine = engine_on(a.device, a.steps)
    run_steps(engine, a.steps, lambda on: setattr(timers, "on", on), warmup=20)
    print(f"{'function':<44} {'us/step':>8} {'calls':>6}   ({a.device}, {a.steps} steps)")
    for target in a.targets:
        label = target.split(":")[1]
        sec, n = timers.seconds[label], timers.calls[label]
        print(f"{label:<44} {1e6 * sec / a.steps:>8.1f} {n / a.steps:>6.2f}")


if __name__ == "__main__":
    main()
