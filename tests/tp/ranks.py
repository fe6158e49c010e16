"""Rank functions the TP tests launch (module level: ``launch_ranks`` pickles them by name).

Each runs many checks in one launch (spawning ranks costs seconds) and returns what it saw.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from hicache.devices import canonical_device
from hicache.model import TPShard
from hicache.tp import TPError, TPGroup, TPPeerError


class StepFailed(RuntimeError):
    """A rank's own step failure, passed to ``agree(failed=...)``."""


def agreement(group: Any) -> dict[str, Any]:
    """min/max vectors, all_ok, digests, failed=, and agree=False, on every rank."""
    tp = TPGroup(group, timeout_s=20)
    r, seen = tp.rank, {}
    seen["rank_size"] = (tp.rank, tp.size, tp.active)
    seen["agree"] = tp.agree([10 + r, -r, 7], [r * r, 5 - r], where="vectors")
    seen["empty"] = tp.agree(where="empty")
    seen["all_ok_true"] = tp.all_ok(True, where="ok")
    seen["all_ok_one_false"] = tp.all_ok(r != tp.size - 1, where="ok")
    tp.check_digest(b"same tree", where="same")
    try:
        tp.check_digest(f"tree of rank {r}".encode() if r == 1 else b"tree", where="digest")
        seen["digest_mismatch"] = "no error"
    except TPError as err:
        seen["digest_mismatch"] = (type(err).__name__, str(err))
    failing = tp.size - 1
    try:
        err = StepFailed(f"rank {r} step failed") if r == failing else None
        tp.agree([r], where="the step", failed=err)
        seen["failed"] = "no error"
    except TPPeerError as peer:
        seen["failed"] = ("TPPeerError", peer.rank, peer.where)
    except StepFailed as own:
        seen["failed"] = ("StepFailed", str(own))
    seen["after_failure"] = tp.agree([r], [r], where="after")  # the group still works
    before = tp.collectives
    off = TPGroup(group, timeout_s=20, agree=False)
    seen["agree_off"] = (
        off.active,
        off.agree([r], [r], where="off"),
        off.all_ok(r == 0, where="off"),
    )
    off.check_digest(f"rank {r}".encode(), where="off")  # no collective: no mismatch seen
    seen["off_collectives"] = (off.collectives, tp.collectives - before)
    try:
        off.agree(where="off", failed=StepFailed("own"))
    except StepFailed:
        seen["off_failed_reraises"] = True
    return seen


def carried_votes(group: Any) -> dict[str, Any]:
    """Votes carried by the next collective, ``resolve`` and ``condition``; the last rank
    votes no. Each entry: what the rank saw and the collectives it took."""
    tp = TPGroup(group, timeout_s=20)
    r, last, seen = tp.rank, tp.size - 1, {}

    def counted(name: str, run: Any) -> None:
        before = tp.collectives
        seen[name] = (run(), tp.collectives - before)

    def carried() -> tuple[Any, ...]:
        vote = tp.carry(r != last, where="vote")
        return tp.agree([r], [r], where="next"), vote.ok

    counted("carried", carried)
    counted("resolve_none", lambda: tp.resolve(where="none"))

    def resolved() -> bool | None:
        vote = tp.carry(True, where="vote")
        tp.resolve(where="resolve")
        return vote.ok

    counted("resolved", resolved)
    given_back: list[str] = []

    def conditioned(mine: bool) -> tuple[Any, ...]:
        with tp.condition(mine, where="condition") as vote:
            kept = tp.keep_if_all("row", given_back.append, where="load")
        return kept, vote.ok, list(given_back)

    counted("condition_fails", lambda: conditioned(r != last))
    counted("condition_holds", lambda: conditioned(True))

    def unused() -> bool | None:
        with tp.condition(True, where="condition") as vote:
            pass
        return vote.ok

    counted("condition_unused", unused)
    return seen


def dead_peer(group: Any) -> dict[str, Any]:
    """Rank 1 exits, rank 2 raises before its collective; rank 0 must get TPError at once,
    then every later call raises at once (the group is broken)."""
    tp = TPGroup(group, timeout_s=15)
    if tp.rank == 1:
        os._exit(5)
    if tp.rank == 2:
        raise ValueError("rank 2 gives up before the collective")
    start, seen = time.monotonic(), {}
    try:
        tp.agree([1], where="with the dead")
        seen["first"] = "no error"
    except TPError as err:
        seen["first"] = (type(err).__name__, time.monotonic() - start)
    calls = tp.collectives
    try:
        tp.all_ok(True, where="broken")
        seen["second"] = "no error"
    except TPError as err:
        seen["second"] = (type(err).__name__, "broken" in str(err), tp.collectives - calls)
    return seen


def stuck_peer(group: Any) -> dict[str, Any]:
    """Rank 1 never reaches the collective (it sleeps until the launcher kills it): rank 0's
    bounded collective must raise TPError after about ``timeout_s``."""
    tp = TPGroup(group, timeout_s=1.5)
    if tp.rank == 1:
        time.sleep(120)
    start = time.monotonic()
    try:
        tp.agree([1], where="with the stuck")
        return {"first": "no error"}
    except TPError:
        waited = time.monotonic() - start
    try:
        tp.check_digest(b"x", where="after")
        return {"first": waited, "second": "no error"}
    except TPError as err:
        return {"first": waited, "second": "broken" in str(err)}


def stuck_model_peer(group: Any, device: str) -> tuple[str, float]:
    """Rank 1 does not reach the model's all-reduce (of a tensor on ``device``, "cpu" or
    "cuda") for 8 s; rank 0's raises after the group's timeout (shorter): the exception's type
    name and the seconds it waited."""
    shard = TPShard.of(group)
    if shard.rank == 1:
        time.sleep(8.0)
        return "slept", 8.0
    x, start = torch.ones(4, device=canonical_device(device)), time.monotonic()
    try:
        shard.all_reduce(x)
        x.cpu()  # a CUDA collective has finished only once its result is read
        return "no error", time.monotonic() - start
    except Exception as exc:
        return type(exc).__name__, time.monotonic() - start
