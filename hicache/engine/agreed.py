"""Rank-local times made equal on every TP rank: the slowest rank's."""

from __future__ import annotations

from hicache.tp import TPGroup


def slowest(tp: TPGroup, seconds: float, *, where: str) -> float:
    """The largest of every rank's ``seconds``, to the microsecond (``seconds`` itself on one
    rank or with agreement off). Every rank of ``tp`` must call it at the same point."""
    if not tp.active:
        return seconds
    (micros,) = tp.agree(maxes=[round(seconds * 1e6)], where=where)[1]
    return micros / 1e6
