"""Rank functions of the shared-memory agreement tests (module level: ``launch_ranks`` pickles
them by name)."""

from __future__ import annotations

import os
import random
import tempfile
import time
from typing import Any

from hicache.tp import TPError, TPGroup, shm

ROUNDS = 300


def vector(seed: int, rank: int, round_: int) -> tuple[list[int], list[int]]:
    """Rank ``rank``'s (mins, maxes) at ``round_``: lengths shared by every rank, values not;
    every 50th round carries more words than the channel takes."""
    shape = random.Random(f"{seed}/{round_}")
    n = 2 * shm.CAPACITY if round_ % 50 == 7 else shape.randrange(0, 12)
    m = shape.randrange(0, 4)
    values = random.Random(f"{seed}/{round_}/{rank}")
    big = 1 << 60
    return [values.randrange(-big, big) for _ in range(n)], [
        values.randrange(-big, big) for _ in range(m)
    ]


def channels(group: Any, seed: int) -> dict[str, Any]:
    """In one launch (spawning ranks costs seconds): ``agree_many`` through each transport,
    ``mismatched``, then ``apart``."""
    seen = {t: agree_many(group, seed, t) for t in ("auto", "group")}
    seen["mismatched"] = mismatched(group)
    return {**seen, "apart": apart(group), "pid": os.getpid()}


def agree_many(group: Any, seed: int, transport: str) -> dict[str, Any]:
    """``ROUNDS`` agreements of random vectors; what came back against the expected minima and
    maxima (computed from every rank's vectors), the channel and the collectives counted."""
    tp = TPGroup(group, timeout_s=30, transport=transport)
    wrong = []
    for i in range(ROUNDS):
        got = tp.agree(*vector(seed, tp.rank, i), where=f"round {i}")
        every = [vector(seed, r, i) for r in range(tp.size)]
        want = (
            [min(col) for col in zip(*(v[0] for v in every), strict=True)],
            [max(col) for col in zip(*(v[1] for v in every), strict=True)],
        )
        if got != want:
            wrong.append(i)
    ok = tp.all_ok(tp.rank != 1, where="one rank says no")
    return {
        "wrong": wrong,
        "channel": tp.channel,
        "collectives": tp.collectives,
        "ok": ok,
        "pid": os.getpid(),
    }


def apart(group: Any) -> dict[str, Any]:
    """Each rank looks for the segment in its own directory (as ranks on two hosts would):
    every rank falls back to the process group, and still agrees. (Changes ``shm.SHM_DIR`` for
    the rest of the process.)"""
    shm.SHM_DIR = tempfile.mkdtemp()
    tp = TPGroup(group, timeout_s=30)
    got = tp.agree([tp.rank + 5], [tp.rank], where="apart")
    return {"channel": tp.channel, "got": got, "left": os.listdir(shm.SHM_DIR)}


def peer_exits(group: Any) -> dict[str, Any]:
    """After one agreement through shared memory rank 1 exits; rank 0's next agreement must
    raise long before the timeout, then the group is broken."""
    tp = TPGroup(group, timeout_s=20)
    tp.agree([1], where="first")
    if tp.rank == 1:
        os._exit(3)
    start = time.monotonic()
    try:
        tp.agree([1], where="with the exited")
        return {"first": "no error"}
    except TPError as err:
        first = (str(err), time.monotonic() - start, tp.channel)
    try:
        tp.all_ok(True, where="broken")
        return {"first": first, "second": "no error"}
    except TPError as err:
        return {"first": first, "second": "broken" in str(err)}


def peer_stalls(group: Any) -> dict[str, Any]:
    """After one agreement rank 1 stops calling for 4 s: rank 0's next agreement raises after
    about ``timeout_s`` (1.0 s)."""
    tp = TPGroup(group, timeout_s=1.0)
    tp.agree([1], where="first")
    if tp.rank == 1:
        time.sleep(4.0)
        return {"slept": 4.0}
    start = time.monotonic()
    try:
        tp.agree([1], where="with the stalled")
        return {"waited": "no error"}
    except TPError as err:
        return {"waited": time.monotonic() - start, "message": str(err)}


def mismatched(group: Any) -> str:
    """Rank r passes r + 1 words: every rank raises TPError."""
    tp = TPGroup(group, timeout_s=10)
    tp.agree([1], where="first")
    try:
        tp.agree(list(range(1 + tp.rank)), where="mismatch")
        return "no error"
    except TPError as err:
        return str(err)
