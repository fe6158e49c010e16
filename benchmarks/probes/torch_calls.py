"""Torch calls per prefill step with a host hit, inside the cache's calls, by call site.

The step of ``bench_control_plane.py`` (TP 1) on ``--device``: one request whose 1,024-token
prefix is a host-only hit, finished in the step. Counts every call into torch's C functions
(tensor methods, ``torch.*`` functions, CUDA events and streams: ``sys.setprofile``'s
``c_call``) made inside the calls ``_cache_meter`` meters, by metered call, torch function and
the hicache line that made it. On CUDA each such call costs ~5-15 us of a step's CPU.

    python benchmarks/probes/torch_calls.py [--device cuda] [--steps 20]
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
from _cache_meter import metered_calls  # noqa: E402


def torch_name(fn: Any) -> str | None:
    """``fn``'s name if it is one of torch's C functions, else None."""
    owner = getattr(fn, "__self__", None)
    module = getattr(fn, "__module__", None) or type(owner).__module__
    if not (module or "").startswith("torch") and not isinstance(owner, torch.Tensor):
        return None
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))


class TorchCalls:
    """Torch C calls per (metered call, function, hicache call site) while ``on``."""

    def __init__(self, engine: Any) -> None:
        self.on, self.counts = False, collections.Counter[tuple[str, str, str]]()
        self._outer: str | None = None
        for part, name, label in metered_calls(engine):
            if not label.startswith("tp."):
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
        if event != "c_call" or self._outer is None:
            return
        name = torch_name(arg)
        if name is None:
            return
        site = frame
        while site is not None and "/hicache/" not in site.f_code.co_filename:
            site = site.f_back
        where = "?"
        if site is not None:
            where = f"{site.f_code.co_filename.split('/hicache/')[-1]}:{site.f_lineno}"
        self.counts[(self._outer, name, where)] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=20)
    a = parser.parse_args()
    torch.set_num_threads(1)
    s = bench.Settings(a.device, a.steps, 8, 1024, 16, 16, "auto")
    engine = bench.build(None, s)
    calls = TorchCalls(engine)
    prefixes = [bench.prompt(i, s.prefix) for i in range(bench.PREFIXES)]
    for p in prefixes:
        engine.submit(p, 1)
    engine.run()
    for i in range(a.steps + 2):
        calls.on = False
        bench.offload(engine)
        engine.submit(prefixes[i % bench.PREFIXES] + bench.prompt(-1 - i, s.new), 1)
        calls.on = i >= 2  # two warm-up steps
        engine.step()
    calls.on = False
    print(f"{'metered call':<30} {'torch call':<34} {'site':<36} {'/step':>6}  ({a.device})")
    for (outer, name, where), n in sorted(calls.counts.items()):
        print(f"{outer:<30} {name:<34} {where:<36} {n / a.steps:>6.2f}")
    print(f"{'all':<102} {sum(calls.counts.values()) / a.steps:>6.2f}")


if __name__ == "__main__":
    main()
