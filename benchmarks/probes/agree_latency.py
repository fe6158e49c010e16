"""Probe: what one TP agreement costs, through each channel, when every rank calls at once.

N CPU ranks (``hicache.tp.run_ranks``, loopback gloo) each call ``TPGroup.agree`` with a few
words in a tight loop, once with ``transport="group"`` (a gloo all-reduce) and once with
``"auto"`` (shared memory, ``hicache.tp.shm``); the mean microseconds per call on the slowest
rank. No rank waits for another's work here: this is the channel's own cost (the bench's
``agree us`` also holds the wait for the slowest rank).

    PYTHONPATH=. python benchmarks/probes/agree_latency.py [--tp 2,4] [--calls 3000]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from hicache.tp import TPGroup, run_ranks

WARMUP = 50


def rank_calls(group: Any, calls: int, transport: str) -> tuple[float, str | None]:
    """Mean microseconds per ``agree`` of 3 words on this rank, and the channel used."""
    tp = TPGroup(group, transport=transport)
    for _ in range(WARMUP):
        tp.agree([1, 2], [3], where="warm-up")
    start = time.perf_counter()
    for _ in range(calls):
        tp.agree([1, 2], [3], where="probe")
    return (time.perf_counter() - start) / calls * 1e6, tp.channel


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tp", default="2,4", help="comma-separated rank counts")
    p.add_argument("--calls", type=int, default=3000)
    a = p.parse_args()
    print(f"{'TP':>3} {'gloo us':>9} {'shm us':>8} {'gloo/shm':>9}")
    for size in (int(t) for t in a.tp.split(",")):
        us = {}
        for transport in ("group", "auto"):
            ranks = run_ranks(rank_calls, size, a.calls, transport, timeout_s=600)
            us[transport] = max(r[0] for r in ranks)
            assert {r[1] for r in ranks} == {"group" if transport == "group" else "shm"}
        print(f"{size:>3} {us['group']:>9.1f} {us['auto']:>8.1f} {us['group'] / us['auto']:>8.1f}x")


if __name__ == "__main__":
    main()
