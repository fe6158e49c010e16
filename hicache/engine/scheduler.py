"""Admission and batch planning: who enters, what prefix they reuse, which tokens run next."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from hicache.engine.config import EngineConfig
from hicache.engine.memory import SlotBudget
from hicache.engine.request import Request, Status
from hicache.radix import HybridMatchResult
from hicache.radix.key import RadixKey


@dataclass(frozen=True)
class Work:
    """One request's part of a step: ``input_ids`` at positions ``kv_len ..``."""

    req: Request
    input_ids: list[int]


class Plan(NamedTuple):
    """A step's work and the KV slots of its new tokens: ``slots`` ``[sum of len(input_ids)]``
    int64 on the table's device, in ``work`` order (allocated at once by ``SlotBudget.grow``;
    under TP they stand once ``SlotBudget.confirm`` says so)."""

    work: list[Work]
    slots: torch.Tensor


class Scheduler:
    """FIFO admission with prefix matching, storage prefetch, host load-back, reservations and
    chunked prefill.

    ``cache`` is a ``RadixCache`` or a ``HiRadixCache``; host hits (only a host tier has them)
    are loaded back. With a storage tier, a request's first ``plan`` after it arrived matches
    its prompt and asks the storage tier for the rest (``prefetch_from_storage``); while that
    prefetch runs (``check_prefetch_progress`` False) admission passes over the request, the
    others keeping their FIFO order. Once it may run, admission matches again and finds the
    pages the prefetch inserted as host-only nodes, which load back like any host hit.
    """

    def __init__(self, cache: Any, budget: SlotBudget, config: EngineConfig) -> None:
        self.cache = cache
        self.budget = budget
        self.config = config
        self.waiting: deque[Request] = deque()
        self.active: list[Request] = []  # PREFILL then DECODE, in admission order
        self.rejected: list[Request] = []  # rejected or aborted, not yet returned by a step
        self.prefetching: set[Request] = set()  # waiting on their storage prefetch
        self.prefetch_events = 0  # prefetches started or finished (the stall check reads it)
        self._arrived: list[Request] = []  # waiting, not yet asked about storage
        hybrid = getattr(cache, "hybrid", None)  # a hybrid cache's components
        self._policy = hybrid.checkpoint if hybrid is not None and hybrid.recurrent else None

    def submit(self, req: Request) -> None:
        reason = self.budget.never_fits(req)
        if reason is None:
            self.waiting.append(req)
            self._arrived.append(req)
        else:
            req.status, req.error = Status.REJECTED, reason
            self.rejected.append(req)

    def abort(self, req: Request) -> bool:
        """Withdraw waiting ``req`` (``ABORTED``; its prefetch released). False, changing
        nothing, when it is not waiting (admitted, finished, rejected or aborted)."""
        if req.status is not Status.WAITING or req not in self.waiting:
            return False
        self.waiting.remove(req)
        self.prefetching.discard(req)
        self.cache.release_aborted_request(str(req.rid))
        req.status, req.error = Status.ABORTED, "aborted"
        self.rejected.append(req)
        return True

    def plan(self) -> Plan:
        """This step's work: one token per decoding request, then prompt chunks within budget;
        then the slots of all its new tokens, allocated at once."""
        self._start_prefetches()
        work = [Work(r, r.next_input_ids) for r in self.active if r.status is Status.DECODE]
        self._plan_prefill(work, self.config.max_prefill_tokens)
        return Plan(work, self.budget.grow([(w.req, len(w.input_ids)) for w in work]))

    def _plan_prefill(self, work: list[Work], left: int) -> None:
        """Append the prompt chunks of admitted requests, then of newly admitted ones, within
        ``left`` tokens."""
        for req in [r for r in self.active if r.status is Status.PREFILL]:
            if left <= 0:
                return
            work.append(self._chunk(req, left))
            left -= len(work[-1].input_ids)
        passed: list[Request] = []  # still prefetching: they keep their place in the queue
        while left > 0 and self.waiting and len(self.active) < self.config.max_running_requests:
            req = self.waiting.popleft()
            if self._still_prefetching(req):
                passed.append(req)
                continue
            if not self._admit(req):
                self.waiting.appendleft(req)
                break
            work.append(self._chunk(req, left))
            left -= len(work[-1].input_ids)
        self.waiting.extendleft(reversed(passed))

    def retire(self, req: Request) -> None:
        self.active.remove(req)

    def _chunk(self, req: Request, limit: int) -> Work:
        """At most ``limit`` tokens; for a model with linear layers, ending where the cache's
        checkpoint policy takes a state (``CheckpointPolicy.chunk_tokens``: the branch point,
        multiples of ``every_tokens``, the prompt's last page boundary), which the chunk's
        ``cache_unfinished_req`` does."""
        if self._policy is not None:
            prompt, page = len(req.origin_input_ids), self.budget.page_size
            finish_at = prompt - prompt % page if prompt % page else None
            branch = req.mamba_branching_seqlen
            limit = self._policy.chunk_tokens(req.kv_len, limit, branch, finish_at)
        return Work(req, req.next_input_ids[:limit])

    @staticmethod
    def _key(req: Request) -> RadixKey:
        """The prompt but its last token (whose logits start the answer), in its namespace."""
        prompt = req.tokens.ids(len(req.origin_input_ids) - 1)  # a view: nothing converted
        return RadixKey.from_validated(prompt, req.extra_key)

    def _start_prefetches(self) -> None:
        """Ask storage for what the tiers above miss of each request that arrived. Without a
        storage tier nothing is matched (no extra lookup in the cache's counters or policy)."""
        if self._arrived and not self.cache.has_storage_tier():
            self._arrived.clear()
        for req in self._arrived:
            if req.status is not Status.WAITING:
                continue
            key = self._key(req)
            match = self.cache.match_prefix(key)
            hit = match.device_prefix_len + match.host_hit_length
            if self.cache.prefetch_from_storage(str(req.rid), match.last_host_node, key[hit:]):
                self.prefetching.add(req)
                self.prefetch_events += 1
        self._arrived.clear()

    def _still_prefetching(self, req: Request) -> bool:
        """Whether ``req`` must wait on its prefetch; when it just finished, note its tokens."""
        if req not in self.prefetching:
            return False
        rid = str(req.rid)
        if not self.cache.check_prefetch_progress(rid):
            return True
        self.prefetching.discard(req)
        self.prefetch_events += 1
        req.storage_hit = self.cache.pop_prefetch_loaded_tokens(rid)
        return False

    def _admit(self, req: Request) -> bool:
        """Match, lock, check the reservation, then load back host hits. False: try later."""
        admitted = self.budget.admit(self._key(req), req.kv_total, self.active)
        if admitted is None:
            return False
        self._install(req, admitted.row, admitted.prefix, admitted.node)
        req.device_hit = admitted.match.device_prefix_len
        if isinstance(admitted.match, HybridMatchResult):
            req.mamba_branching_seqlen = admitted.match.mamba_branching_seqlen
        loaded = len(admitted.prefix) - req.device_hit
        req.storage_hit = min(req.storage_hit, loaded)  # what the prefetch added, if still there
        req.host_hit = loaded - req.storage_hit
        self.active.append(req)
        return True

    def _install(self, req: Request, row: int, prefix: torch.Tensor, node: Any) -> None:
        n = len(prefix)
        self.budget.req_to_token_pool.write((row, slice(0, n)), prefix, trusted=True)  # ours
        req.req_pool_idx, req.prefix_indices, req.last_node = row, prefix, node
        req.kv_len = req.kv_capacity = req.cache_protected_len = n
        req.status = Status.PREFILL
