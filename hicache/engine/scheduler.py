"""Admission and batch planning: who enters, what prefix they reuse, which tokens run next."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from hicache.engine.config import EngineConfig
from hicache.engine.memory import SlotBudget
from hicache.engine.request import Request, Status
from hicache.radix.key import RadixKey


@dataclass(frozen=True)
class Work:
    """One request's part of a step: ``input_ids`` at positions ``kv_len ..``, KV at ``slots``."""

    req: Request
    input_ids: list[int]
    slots: torch.Tensor  # [len(input_ids)] int64 on the allocator device


class Scheduler:
    """FIFO admission with prefix matching, host load-back, reservations and chunked prefill.

    ``cache`` is a ``RadixCache`` or a ``HiRadixCache``; host hits (only a host tier has them)
    are loaded back.
    """

    def __init__(self, cache: Any, budget: SlotBudget, config: EngineConfig) -> None:
        self.cache = cache
        self.budget = budget
        self.config = config
        self.waiting: deque[Request] = deque()
        self.active: list[Request] = []  # PREFILL then DECODE, in admission order
        self.rejected: list[Request] = []

    def submit(self, req: Request) -> None:
        reason = self.budget.never_fits(req)
        if reason is None:
            self.waiting.append(req)
        else:
            req.status, req.error = Status.REJECTED, reason
            self.rejected.append(req)

    def plan(self) -> list[Work]:
        """This step's work: one token per decoding request, then prompt chunks within budget."""
        work = [self._take(r, r.next_input_ids) for r in self.active if r.status is Status.DECODE]
        left = self.config.max_prefill_tokens
        for req in [r for r in self.active if r.status is Status.PREFILL]:
            if left <= 0:
                return work
            work.append(self._chunk(req, left))
            left -= len(work[-1].input_ids)
        while left > 0 and self.waiting and len(self.active) < self.config.max_running_requests:
            if not self._admit(self.waiting[0]):
                break
            work.append(self._chunk(self.waiting.popleft(), left))
            left -= len(work[-1].input_ids)
        return work

    def retire(self, req: Request) -> None:
        self.active.remove(req)

    def _chunk(self, req: Request, limit: int) -> Work:
        return self._take(req, req.next_input_ids[:limit])

    def _take(self, req: Request, ids: list[int]) -> Work:
        return Work(req, ids, self.budget.grow(req, len(ids)))

    def _admit(self, req: Request) -> bool:
        """Match, lock, check the reservation, then load back host hits. False: try later."""
        prompt = req.tokens.ids(len(req.origin_input_ids) - 1)  # a view: nothing converted
        key = RadixKey.from_validated(prompt, req.extra_key)
        admitted = self.budget.admit(key, req.kv_total, self.active)
        if admitted is None:
            return False
        self._install(req, admitted.row, admitted.prefix, admitted.node)
        req.device_hit = len(admitted.match.device_indices)
        req.host_hit = len(admitted.prefix) - req.device_hit
        self.active.append(req)
        return True

    def _install(self, req: Request, row: int, prefix: torch.Tensor, node: Any) -> None:
        n = len(prefix)
        self.budget.req_to_token_pool.write((row, slice(0, n)), prefix.to(torch.int32))
        req.req_pool_idx, req.prefix_indices, req.last_node = row, prefix, node
        req.kv_len = req.kv_capacity = req.cache_protected_len = n
        req.status = Status.PREFILL
