"""TPGroup: the agreement point of the ranks of one tensor-parallel group.

Under TP every rank holds its shard of the KV in its own pools and an identical tree. A
decision that depends on a rank's own state (an allocation that failed, a transfer that has
landed, what storage answered, a clock) is taken only through :meth:`TPGroup.agree`: each rank
offers its values, every rank gets the minimum (or maximum) over ranks, so every rank takes the
same decision. A decision that depends only on the tree is taken locally: identical trees and
identical calls make it identical on every rank.

Collectives are bounded by ``timeout_s``. A collective that fails or times out (a rank died or
stopped calling) raises :class:`TPError` on every rank that reaches it, and the group is then
broken: every later call raises at once. A rank whose own step failed passes the exception to
``agree(failed=...)``: it re-raises it, every other rank raises :class:`TPPeerError` naming it.

Ranks on one host agree through shared memory (``hicache.tp.shm``: a few microseconds a call
where a gloo all-reduce costs 50 us to milliseconds), set up by the group's first agreement;
``transport="group"``, ranks on other hosts, or vectors over ``shm.CAPACITY`` words use the
process group. Either way the agreement is bounded by ``timeout_s`` and breaks the group as
above. Over the process group the agreement runs on CPU tensors whenever the group takes them
(gloo, or a mixed ``"cpu:gloo,cuda:nccl"`` group: ``hicache.tp.placement``): it then never
touches the GPU. Only a group that takes CUDA tensors alone (plain NCCL) makes each agreement
copy its words to the GPU and back, which waits for the compute stream: give the cache a gloo
group (SGLang's ``tp_cpu_group``) beside an NCCL one, or let the ranks share memory.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from hicache.checks import check_bool
from hicache.tp import shm
from hicache.tp.placement import takes_cpu_tensors

T = TypeVar("T")

_OK = 1 << 62  # a rank's status word when its step succeeded (larger than any rank id)
TRANSPORTS = ("auto", "group")


class TPError(RuntimeError):
    """A TP collective failed or timed out, or the ranks' trees diverged (debug digests)."""


class TPPeerError(TPError):
    """Another rank's step failed at an agreement point; this rank's state is unchanged by it.

    Attributes
    ----------
    rank : the lowest rank that failed.
    where : the agreement point.
    """

    def __init__(self, rank: int, where: str) -> None:
        super().__init__(f"TP rank {rank} failed at {where}; every rank stopped there")
        self.rank, self.where = rank, where


class Vote:
    """A rank's ``mine`` put off to a later agreement (``TPGroup.carry``): ``ok`` is None
    until an agreement has carried it, then whether ``mine`` held on every rank."""

    __slots__ = ("mine", "ok")

    def __init__(self, mine: bool) -> None:
        self.mine = mine
        self.ok: bool | None = None


class TPGroup:
    """The ranks of one TP group as the cache sees them.

    Parameters
    ----------
    group : a ``torch.distributed`` process group, or None for one rank (no collectives).
    timeout_s : bound on each collective, seconds (> 0).
    agree : test-only switch: False makes every call return this rank's own values with no
        collective, so ranks decide alone (and diverge under rank-local faults).
    debug : whether ``HiRadixCache.check_hicache_events`` compares tree digests every step.
    transport : ``"auto"`` (shared memory where every rank maps it, else the process group) or
        ``"group"`` (the process group only); the same on every rank.

    Attributes
    ----------
    rank, size : this rank and the group size.
    collectives : collectives issued so far.
    channel : ``"shm"`` or ``"group"``, what the agreements go through; None until the first.
    """

    def __init__(
        self,
        group: Any = None,
        *,
        timeout_s: float = 60.0,
        agree: bool = True,
        debug: bool = False,
        transport: str = "auto",
    ) -> None:
        number = isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool)
        if not number or not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if group is not None and not dist.is_initialized():
            raise ValueError("tp_group: torch.distributed is not initialized")
        self.group, self.timeout = group, timedelta(seconds=float(timeout_s))
        self.enabled, self.debug = check_bool("agree", agree), check_bool("debug", debug)
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {list(TRANSPORTS)}, got {transport!r}")
        self.transport = transport
        self.channel: str | None = None
        self._shm: shm.ShmChannel | None = None
        self.rank = 0 if group is None else dist.get_rank(group)
        self.size = 1 if group is None else dist.get_world_size(group)
        self.collectives = 0
        self._broken: str | None = None
        self._votes: list[Vote] = []  # carried, not yet agreed
        self._conditions: list[Vote] = []  # open ``condition`` blocks
        gpu_only = group is not None and not takes_cpu_tensors(str(dist.get_backend(group)))
        self._device = torch.device("cuda", torch.cuda.current_device()) if gpu_only else None

    @property
    def active(self) -> bool:
        """Whether decisions go through collectives (more than one rank, agreement on)."""
        return self.size > 1 and self.enabled

    def agree(
        self,
        mins: Sequence[int] = (),
        maxes: Sequence[int] = (),
        *,
        where: str,
        failed: BaseException | None = None,
    ) -> tuple[list[int], list[int]]:
        """The minimum over ranks of each of ``mins`` and the maximum of each of ``maxes``, in
        one collective. Every rank must call it at the same point with vectors of the same
        lengths. ``failed``: this rank's step raised it; it is re-raised here after the
        collective (other ranks raise ``TPPeerError``)."""
        if not self.active:
            if failed is not None:
                raise failed
            return list(mins), list(maxes)
        status = self.rank if failed is not None else _OK
        votes, self._votes = self._votes, []
        carried = [int(v.mine) for v in votes]
        out = self._all_reduce_min([status, *mins, *(-m for m in maxes), *carried], where)
        for vote, word in zip(votes, out[len(out) - len(votes) :], strict=True):
            vote.ok = bool(word)
        if failed is not None:
            raise failed
        if out[0] != _OK:
            raise TPPeerError(out[0], where)
        n, m = len(mins), len(maxes)
        return out[1 : 1 + n], [-v for v in out[1 + n : 1 + n + m]]

    def all_ok(self, ok: bool, *, where: str) -> bool:
        """Whether ``ok`` holds on every rank, and every open ``condition`` too."""
        agreed = (
            bool(ok) if not self.active else bool(self.agree([int(bool(ok))], where=where)[0][0])
        )
        conditions = self._conditions
        return agreed and (not conditions or all(vote.ok for vote in conditions))

    def carry(self, ok: bool, *, where: str) -> Vote:
        """This rank's ``ok``, agreed by the next collective of this group (whatever its
        ``where``) rather than one of its own: ``Vote.ok`` tells once it has run (at once on one
        rank). Every rank must carry at the same points; ``resolve`` runs a collective for
        votes that none carried. ``where`` names the point in errors of ``resolve``."""
        vote = Vote(bool(ok))
        if self.active:
            self._votes.append(vote)
        else:
            vote.ok = vote.mine
        return vote

    def resolve(self, *, where: str) -> None:
        """Agree on the carried votes that no collective has carried yet (none: no-op)."""
        if self._votes:
            self.agree(where=where)

    @contextmanager
    def condition(self, ok: bool, *, where: str) -> Iterator[Vote]:
        """``carry(ok)`` as a precondition of the decisions taken inside the block: every
        ``all_ok`` / ``keep_if_all`` there answers False (giving back) once the vote has
        failed. On leaving the block normally, ``resolve`` (one collective at most)."""
        vote = self.carry(ok, where=where)
        self._conditions.append(vote)
        try:
            yield vote
        finally:
            self._conditions.remove(vote)
        self.resolve(where=where)

    def keep_if_all(
        self, got: T | None, give_back: Callable[[T], object], *, where: str
    ) -> T | None:
        """``got`` (this rank's allocation, None when it failed) if every rank got its own; else
        None, after ``give_back(got)`` where this rank did get it."""
        if not self.active and not self._conditions:  # ``all_ok``'s answer on one rank
            return got
        if self.all_ok(got is not None, where=where):
            return got
        if got is not None:
            give_back(got)
        return None

    def check_digest(self, digest: bytes, *, where: str) -> None:
        """``TPError`` on every rank unless every rank passed the same ``digest``."""
        words = [
            int.from_bytes(hashlib.sha256(digest).digest()[i : i + 7], "little") for i in (0, 7)
        ]
        low, high = self.agree(words, words, where=where)
        if low != high:
            raise TPError(f"TP ranks diverged at {where}: tree digests differ across ranks")

    def _all_reduce_min(self, words: list[int], where: str) -> list[int]:
        if self._broken is not None:
            raise TPError(f"TP group is broken ({self._broken}); rebuild the cache")
        self.collectives += 1
        try:
            if self.channel is None:
                self._open_channel()
            if self._shm is not None and len(words) <= shm.CAPACITY:
                deadline = time.monotonic() + self.timeout.total_seconds()
                return self._shm.all_reduce_min(words, deadline)
            return self._collective(torch.tensor(words, dtype=torch.int64), "min")
        except Exception as exc:  # a dead or stuck rank: every rank that gets here stops
            self._broken = f"collective at {where} failed: {exc}"
            raise TPError(f"TP rank {self.rank}/{self.size}: {self._broken}") from exc

    def _open_channel(self) -> None:
        """Pick the agreements' channel (collectives of the group; every rank at its first)."""
        if self.transport == "auto" and shm.supported():
            self._shm = shm.ShmChannel.open(self.rank, self.size, self._collective)
        self.channel = "group" if self._shm is None else "shm"

    def _collective(self, words: torch.Tensor, kind: str) -> list[int]:
        """One bounded collective of the group over ``words``: their element-wise minimum
        (``kind="min"``) or every rank's, concatenated in rank order (``"gather"``)."""
        if self._device is not None:
            words = words.to(self._device)
        if kind == "min":
            out = [words]
            work = dist.all_reduce(words, dist.ReduceOp.MIN, group=self.group, async_op=True)
        else:
            out = [torch.empty_like(words) for _ in range(self.size)]
            work = dist.all_gather(out, words, group=self.group, async_op=True)
        assert work is not None
        work.wait(timeout=self.timeout)
        return [int(v) for v in torch.cat(out).cpu().tolist()]


def as_tp_group(tp_group: Any) -> TPGroup:
    """``tp_group`` as given to a cache: None (one rank), a ``TPGroup``, or a process group."""
    if isinstance(tp_group, TPGroup):
        return tp_group
    if tp_group is not None and not isinstance(tp_group, dist.ProcessGroup):
        raise TypeError(
            f"tp_group must be a torch.distributed ProcessGroup, a TPGroup or None, "
            f"got {type(tp_group).__name__}"
        )
    return TPGroup(tp_group)


__all__ = ["TPError", "TPGroup", "TPPeerError", "Vote", "as_tp_group"]
