"""A rank of a two-rank TP group whose other rank is scripted, in one process.

``PeerGroup`` is one rank (0 by default) of a group of two: each agreement takes the
element-wise minimum of this rank's words and the words ``peer[where](words)`` returns for the
other rank (by default the same words: a peer that agrees). Words are ``TPGroup.agree``'s:
a status word first (a rank id when that rank failed), then the mins, then the negated maxes.
"""

from __future__ import annotations

from collections.abc import Callable

from hicache.tp import TPGroup

Words = list[int]


class PeerGroup(TPGroup):
    def __init__(self, rank: int = 0, **kwargs: object) -> None:
        super().__init__(None, **kwargs)  # type: ignore[arg-type]
        self.rank, self.size = rank, 2
        self.peer: dict[str, Callable[[Words], Words]] = {}
        self.seen: list[tuple[str, Words]] = []

    def _all_reduce_min(self, words: list[int], where: str) -> list[int]:
        mine = [int(v) for v in words]
        theirs = self.peer.get(where, list)(list(mine))
        self.seen.append((where, mine))
        self.collectives += 1
        return [min(a, b) for a, b in zip(mine, theirs, strict=True)]

    def wheres(self) -> list[str]:
        return [where for where, _ in self.seen]


def zeros_after_status(words: Words) -> Words:
    """A peer whose every min is 0 (it got nothing, finished nothing)."""
    return [words[0]] + [0] * (len(words) - 1)


def failed_peer(words: Words) -> Words:
    """A peer whose own step raised (status word = its rank, 1)."""
    return [1, *words[1:]]


def with_words(**at: int) -> Callable[[Words], Words]:
    """A peer whose words at the given positions (``w1=2``: the first word after the status)
    are the given values, the rest as ours."""

    def peer(words: Words) -> Words:
        out = list(words)
        for name, value in at.items():
            out[int(name[1:])] = value
        return out

    return peer
