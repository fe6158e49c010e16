"""A request in flight in the stress driver: its slots, its ``Req`` and the "model" that writes
its KV."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hicache.radix import Req
from hicache.stress.workload import Turn


@dataclass(eq=False)
class Live:
    """A request in flight: ``slots`` were allocated for positions ``base ..``."""

    turn: Turn
    req: Req
    slots: torch.Tensor
    base: int
    target: int
    _own: tuple[int, torch.Tensor] | None = None

    def own(self) -> torch.Tensor:
        """Slots still the request's: positions from ``cache_protected_len`` on (the same
        tensor until that moves, so a checker can tell it did not change)."""
        start = max(self.req.cache_protected_len - self.base, 0)
        if self._own is None or self._own[0] != start:
            self._own = (start, self.slots[start:])
        return self._own[1]

    def compute(self, write: Callable[..., None], end: int) -> None:
        """The model's forward over positions ``[kv_len, end)``: ``write(slots, tokens,
        positions, salt)`` stores their KV (:func:`hicache.stress.oracle.write_kv` of a pool)."""
        start, req = self.req.kv_len, self.req
        tokens = torch.from_numpy(req.tokens.ids(end)[start:].astype("int64"))
        write(
            self.slots[start - self.base : end - self.base],
            tokens,
            torch.arange(start, end),
            self.turn.conversation.salt,
        )
        req.kv_len = end


@dataclass(eq=False)
class StateReq(Req):
    """A ``Req`` with what a hybrid cache reads: the match's ``mamba_branching_seqlen`` and
    the decode tracking's ``mamba_next_track_idx`` / ``mamba_last_track_seqlen``."""

    mamba_branching_seqlen: int | None = None
    mamba_next_track_idx: int = 0
    mamba_last_track_seqlen: int | None = None


def start_request(
    req_pool: Any,
    turn: Turn,
    prefix: torch.Tensor,
    node: Any,
    slots: torch.Tensor,
    target: int,
    req: Req | None = None,
) -> Live:
    """A request row holding ``prefix`` then ``slots``, and the ``Live`` around it. ``req``:
    a request of ``turn`` whose row is allocated already (with its state slot); by default a
    new ``Req`` in a new row."""
    if req is None:
        (row,) = req_pool.alloc(1)
        req = Req(row, turn.prompt)
    n = len(prefix)
    req_pool.write((req.req_pool_idx, slice(0, n)), prefix.to(req_pool.device))
    req_pool.write((req.req_pool_idx, slice(n, target)), slots[: target - n].to(req_pool.device))
    req.output_ids, req.kv_len, req.extra_key = list(turn.output), n, turn.conversation.tenant
    req.prefix_indices, req.last_node, req.cache_protected_len = prefix, node, n
    return Live(turn, req, slots, n, target)
