"""Start the ranks of a TP group as processes talking gloo over loopback.

``launch_ranks(fn, size, *args)`` spawns ``size`` processes; rank r runs
``fn(group, *args)`` with ``group`` the default process group (gloo, 127.0.0.1), and sends back
what it returned or how it failed. A rank that has not finished by ``timeout_s`` is killed.
A rank's result is pickled through a queue and the rank exits at once (``os._exit``, so gloo's
teardown cannot block on a dead peer): return plain Python or numpy values, not torch tensors
(their shared-memory handles die with the process).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any


@dataclass(frozen=True)
class RankOutcome:
    """How one rank ended: ``result`` when ``error`` is None; else the exception's type name
    (``error``) and its traceback (``detail``); ``"killed"`` when it had to be stopped,
    ``"exited"`` when it died without a word."""

    rank: int
    result: Any = None
    error: str | None = None
    detail: str = ""


class RankFailed(RuntimeError):
    """At least one rank of ``run_ranks`` failed; ``outcomes`` has every rank's."""

    def __init__(self, outcomes: list[RankOutcome]) -> None:
        bad = [o for o in outcomes if o.error is not None]
        lines = [f"rank {o.rank}: {o.error}\n{o.detail}" for o in bad]
        super().__init__(f"{len(bad)} of {len(outcomes)} ranks failed:\n" + "\n".join(lines))
        self.outcomes = outcomes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _rank_main(
    rank: int,
    size: int,
    port: int,
    timeout_s: float,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    out: Any,
) -> None:
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=size,
            timeout=timedelta(seconds=timeout_s),
        )
        out.put((rank, fn(dist.group.WORLD, *args), None, ""))
    except BaseException as exc:  # reported to the parent, which decides
        out.put((rank, None, type(exc).__name__, traceback.format_exc()))
    finally:
        out.close()
        out.join_thread()
        os._exit(0)  # skip gloo's teardown, which can block on a dead peer


def launch_ranks(
    fn: Callable[..., Any], size: int, *args: Any, timeout_s: float = 300.0
) -> list[RankOutcome]:
    """Run ``fn(group, *args)`` on ``size`` ranks (``fn`` picklable: a module-level function);
    every rank's outcome, in rank order. Never raises for a rank's failure."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"size must be a positive int, got {size!r}")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, size, port, timeout_s, fn, args, out), daemon=True)
        for r in range(size)
    ]
    for p in procs:
        p.start()
    outcomes: dict[int, RankOutcome] = {}
    deadline = time.monotonic() + timeout_s
    while len(outcomes) < size and time.monotonic() < deadline:
        try:
            rank, result, error, detail = out.get(timeout=0.2)
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and out.empty():
                break
            continue
        outcomes[rank] = RankOutcome(rank, result, error, detail)
    for r, p in enumerate(procs):
        p.join(timeout=1.0 if r in outcomes else 0)
        if p.is_alive():
            p.kill()
            p.join()
        if r not in outcomes:
            outcomes[r] = RankOutcome(r, None, "killed" if p.exitcode == -9 else "exited")
    return [outcomes[r] for r in range(size)]


def run_ranks(fn: Callable[..., Any], size: int, *args: Any, timeout_s: float = 300.0) -> list[Any]:
    """As ``launch_ranks``, returning each rank's result; ``RankFailed`` if any rank failed."""
    outcomes = launch_ranks(fn, size, *args, timeout_s=timeout_s)
    if any(o.error is not None for o in outcomes):
        raise RankFailed(outcomes)
    return [o.result for o in outcomes]
