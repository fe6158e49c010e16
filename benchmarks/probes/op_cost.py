"""Probe: the CPU cost of each torch call the cache's step makes on CUDA (us per call, medians).

Each row is one call as the scheduler's path makes it (a 64-slot index tensor), timed in a loop
with the GPU idle: what a step pays per such call before any bookkeeping of its own.

    PYTHONPATH=. python3 benchmarks/probes/op_cost.py
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from host_hit import us_per_call  # noqa: E402


def main() -> None:
    dev = torch.device("cuda")
    stream = torch.cuda.Stream()
    host = torch.arange(64)
    pinned = host.pin_memory()
    on_dev = pinned.to(dev)
    table = torch.zeros(8, 4096, dtype=torch.int32, device=dev)
    event, timed = torch.cuda.Event(), torch.cuda.Event(enable_timing=True)
    event.record(stream)
    arr = np.arange(64)
    rows: list[tuple[str, Callable[[], object]]] = [
        ("torch.from_numpy", lambda: torch.from_numpy(arr)),
        ("pin_memory (64 int64)", host.pin_memory),
        ("pinned.to(cuda, non_blocking)", lambda: pinned.to(dev, non_blocking=True)),
        ("on_dev.to(cuda) (no-op)", lambda: on_dev.to(dev, non_blocking=True)),
        ("on_dev.to(int32)", lambda: on_dev.to(torch.int32)),
        ("table[1, 0:64] = on_dev", lambda: table[1, 0:64].copy_(on_dev)),
        ("torch.cuda.Event()", torch.cuda.Event),
        ("Event(enable_timing)", lambda: torch.cuda.Event(enable_timing=True)),
        ("event.record(stream)", lambda: event.record(stream)),
        ("timed.record(stream)", lambda: timed.record(stream)),
        ("timed.record() (current)", timed.record),
        ("event.query()", event.query),
        ("stream.wait_event(event)", lambda: stream.wait_event(event)),
        ("torch.cuda.current_stream()", torch.cuda.current_stream),
        ("torch.cuda.set_stream(stream)", lambda: torch.cuda.set_stream(stream)),
        ("on_dev.record_stream(stream)", lambda: on_dev.record_stream(stream)),
        ("torch.cat 2 (cuda)", lambda: torch.cat([on_dev, on_dev])),
        ("on_dev[0:32] (view)", lambda: on_dev[0:32]),
    ]
    torch.cuda.set_stream(torch.cuda.default_stream())
    print(f"{'call':<34} {'us':>7}")
    for name, fn in rows:
        cost = us_per_call(fn, calls=200, repeats=11)
        torch.cuda.set_stream(torch.cuda.default_stream())
        print(f"{name:<34} {cost:>7.2f}")


if __name__ == "__main__":
    main()
