"""Start the ranks of a TP group as processes over loopback (127.0.0.1).

``launch_ranks(fn, size, *args, device=...)`` spawns ``size`` processes; rank r runs
``fn(group, *args)`` with ``group`` the default process group, and sends back what it returned
or how it failed. On ``device="cuda"`` rank r first makes ``cuda:{r % device_count}`` its
current device, so ``"cuda"`` means its own GPU; the group's backends are
``hicache.tp.placement``'s (NCCL for CUDA tensors when every rank has its own GPU, gloo
otherwise and for CPU tensors). Every collective of the group is bounded by
``group_timeout_s`` (gloo raises; NCCL's watchdog aborts the rank's process). A rank that has
not finished by ``timeout_s`` is killed.
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

import torch

from hicache.tp.placement import RankPlacement, place_rank


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
    place: RankPlacement,
    size: int,
    port: int,
    group_timeout_s: float,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    out: Any,
) -> None:
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    rank = place.rank
    try:
        if place.device != "cpu":
            torch.cuda.set_device(place.device)  # before the group: NCCL binds the current GPU
        dist.init_process_group(
            place.backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=size,
            timeout=timedelta(seconds=group_timeout_s),
        )
        out.put((rank, fn(dist.group.WORLD, *args), None, ""))
    except BaseException as exc:  # reported to the parent, which decides
        out.put((rank, None, type(exc).__name__, traceback.format_exc()))
    finally:
        out.close()
        out.join_thread()
        os._exit(0)  # skip gloo's teardown, which can block on a dead peer


def placements(device: str, size: int) -> list[RankPlacement]:
    """Where each of ``size`` ranks on ``device`` (``"cpu"``/``"cuda"``) runs on this machine;
    ``ValueError`` as ``place_rank``."""
    count = torch.cuda.device_count() if device == "cuda" else 0
    return [place_rank(device, r, size, count) for r in range(size)]


def _check_seconds(name: str, value: float) -> float:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def launch_ranks(
    fn: Callable[..., Any],
    size: int,
    *args: Any,
    timeout_s: float = 300.0,
    device: str = "cpu",
    group_timeout_s: float | None = None,
) -> list[RankOutcome]:
    """Run ``fn(group, *args)`` on ``size`` ranks (``fn`` picklable: a module-level function);
    every rank's outcome, in rank order. Never raises for a rank's failure.

    ``device``: ``"cpu"`` or ``"cuda"`` (rank r on ``cuda:{r % device_count}``).
    ``group_timeout_s``: the process group's timeout (its rendezvous and each collective);
    None: ``timeout_s``. ``ValueError`` for a bad argument, before any process starts."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"size must be a positive int, got {size!r}")
    _check_seconds("timeout_s", timeout_s)
    bound = _check_seconds(
        "group_timeout_s", timeout_s if group_timeout_s is None else group_timeout_s
    )
    places = placements(device, size)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(p, size, port, bound, fn, args, out), daemon=True)
        for p in places
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


def run_ranks(
    fn: Callable[..., Any],
    size: int,
    *args: Any,
    timeout_s: float = 300.0,
    device: str = "cpu",
    group_timeout_s: float | None = None,
) -> list[Any]:
    """As ``launch_ranks``, returning each rank's result; ``RankFailed`` if any rank failed."""
    outcomes = launch_ranks(
        fn, size, *args, timeout_s=timeout_s, device=device, group_timeout_s=group_timeout_s
    )
    if any(o.error is not None for o in outcomes):
        raise RankFailed(outcomes)
    return [o.result for o in outcomes]
