"""Calls per prefill step with a host hit, inside the cache's calls: Python calls, or torch's.

The step of ``bench_control_plane.py`` (TP 1; ``host_hit.py``). Counts, per call that
``_cache_meter`` meters (the cache's, its allocator's and request table's):

- by default every Python-level call made inside it, outside the spans that copy KV (the CPU
  figure subtracts those). A deterministic figure, unlike the noisy microseconds of a shared
  box: on the scheduler's path each such call costs ~0.7-1 us of a step;
- with ``--torch``, every call into torch's C functions (tensor methods, ``torch.*``, CUDA
  events and streams) by the hicache line that made it: on CUDA each costs ~2-17 us of a
  step (``op_cost.py``).

    python benchmarks/probes/step_calls.py [--steps 20] [--torch [--device cuda]]
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

from _cache_meter import metered_calls  # noqa: E402
from host_hit import engine_on, run_steps  # noqa: E402

# inside the copy spans (``BusyClock`` begin..end): the batch's backend, indices, plan and copy
COPIES = {
    "batch_backend",
    "transfer_indices",
    "backup_from_device_all_layer",
    "plan_load",
    "through",
}


def torch_name(fn: Any) -> str | None:
    """``fn``'s name if it is one of torch's C functions, else None."""
    owner = getattr(fn, "__self__", None)
    module = getattr(fn, "__module__", None) or type(owner).__module__
    if not (module or "").startswith("torch") and not isinstance(owner, torch.Tensor):
        return None
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))


def call_site(frame: FrameType | None) -> str:
    """The innermost hicache line on ``frame``'s stack."""
    while frame is not None and "/hicache/" not in frame.f_code.co_filename:
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename.split('/hicache/')[-1]}:{frame.f_lineno}"


class CallCounter:
    """Calls per metered call of ``engine`` while ``on``: Python calls outside the copy spans,
    or (``torch``) torch C calls by call site."""

    def __init__(self, engine: Any, torch_calls: bool = False) -> None:
        self.on, self.torch = False, torch_calls
        self.counts = collections.Counter[tuple[str, ...]]()
        self._outer: str | None = None
        self._copying = 0
        for part, name, label in metered_calls(engine):
            if not label.startswith("tp."):
                setattr(part, name, self._counted(getattr(part, name), label))

    def _counted(self, call: Any, name: str) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if not self.on or self._outer is not None:
                return call(*args, **kwargs)
            self._outer = name
            sys.setprofile(self._torch if self.torch else self._python)
            try:
                return call(*args, **kwargs)
            finally:
                sys.setprofile(None)
                self._outer = None

        return counted

    def _python(self, frame: FrameType, event: str, arg: Any) -> None:
        name = frame.f_code.co_name
        if event == "call":
            self._copying += name in COPIES
            if not self._copying and self._outer is not None:
                self.counts[(self._outer,)] += 1
        elif event == "return" and name in COPIES:
            self._copying -= 1

    def _torch(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call" and self._outer is not None:
            name = torch_name(arg)
            if name is not None:
                self.counts[(self._outer, name, call_site(frame))] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--torch", action="store_true", help="count torch calls by call site")
    a = parser.parse_args()
    engine = engine_on(a.device, a.steps)
    counter = CallCounter(engine, a.torch)
    run_steps(engine, a.steps, lambda on: setattr(counter, "on", on))
    what = "torch calls / step, by site" if a.torch else "python calls / step"
    print(f"{'call':40s} {what:>30s}  ({a.device})")
    for key, n in sorted(counter.counts.items()):
        print(f"{'  '.join(key):70s} {n / a.steps:8.2f}")
    print(f"{'all':70s} {sum(counter.counts.values()) / a.steps:8.2f}")


if __name__ == "__main__":
    main()
