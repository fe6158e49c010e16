"""A request in flight in the stress driver: its slots, its ``Req`` and the "model" that writes
its KV."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hicache.radix import Req
from hicache.stress.oracle import write_kv
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

    def compute(self, pool: Any, end: int) -> None:
        """The model's forward over positions ``[kv_len, end)``: write their KV into ``pool``."""
        start, req = self.req.kv_len, self.req
        tokens = torch.from_numpy(req.tokens.ids(end)[start:].astype("int64"))
        write_kv(
            pool,
            self.slots[start - self.base : end - self.base],
            tokens,
            torch.arange(start, end),
            self.turn.conversation.salt,
        )
        req.kv_len = end


def start_request(
    req_pool: Any, turn: Turn, prefix: torch.Tensor, node: Any, slots: torch.Tensor, target: int
) -> Live:
    """A request row holding ``prefix`` then ``slots``, and the ``Live`` around it."""
    (row,) = req_pool.alloc(1)
    n = len(prefix)
    req_pool.write((row, slice(0, n)), prefix.to(req_pool.device))
    req_pool.write((row, slice(n, target)), slots[: target - n].to(req_pool.device))
    req = Req(
        row,
        turn.prompt,
        list(turn.output),
        kv_len=n,
        extra_key=turn.conversation.tenant,
        prefix_indices=prefix,
        last_node=node,
        cache_protected_len=n,
    )
    return Live(turn, req, slots, n, target)
