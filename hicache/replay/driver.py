"""The replay loop: trace arrivals through the real cache, iteration by iteration, on a
modelled clock.

Each iteration (as ``hicache.engine``'s, without a model):

1. ``check_hicache_events()``; requests whose arrival time has come join the waiting queue.
2. The decode batch is every request past its prefill: one token each.
3. Prefill, FIFO, within ``max_prefill_tokens``: the current request's next chunk; when its
   prompt is done (``cache_unfinished_req``: its pages enter the tree) the next waiting one is
   admitted, while ``max_running`` and the slot budget allow: with a storage tier its storage
   prefetch first (below); ``match_prefix`` on the prompt but its last token,
   ``inc_lock_ref``, the budget check (free + evictable slots, as ``SlotBudget``),
   ``init_load_back`` of a host hit, ``ready_to_load_host_cache`` / ``consume_load_batch``,
   and slots for every token the request will hold (evicting when short).
   Prefilling one request at a time costs the same modelled time as batching prompts (the cost
   is linear in tokens) and makes every request see all earlier prompts in the cache.
   A hybrid model (``HybridRadixCache``) as the engine: a chunk ends where the checkpoint
   policy takes a state (``CheckpointPolicy.chunk_tokens``), ``cache_unfinished_req`` follows every
   chunk (where ``CheckpointPolicy.every_tokens`` and ``at_branch`` take states; full
   attention: once, at the prompt's end, the same tree), and a free state slot is made before
   each ``cache_*_req`` (``SlotBudget.state_room``).
4. The clock advances by ``CostModel.step_seconds``, a host hit's state load
   (``state_bytes``) charged on top of its KV; a request whose prompt finished gets its
   first token then; one whose last token was generated is finished (``cache_finished_req``;
   its decode slots are freed, see ``LiveRequest``).

Iterations with only decode work are taken many at a time, up to the next event (an arrival
that could be admitted, a request finishing): nothing in the cache changes between them.

Storage (the engine's calls, ``hicache.engine.scheduler``): when a request first comes up for
admission, ``drain_transfers`` (every earlier backup has landed), ``match_prefix``, then
``prefetch_from_storage`` of what device and host miss; the prefetch policy is
``wait_complete``, so the replay waits for it (``drain_transfers`` again), then
``check_prefetch_progress`` adopts the pages read as host-only nodes and
``pop_prefetch_loaded_tokens`` counts them; admission loads them back like a host hit. The
engine prefetches on arrival and a live prefetch may miss a write still in flight; the replay
prefetches at the head of the queue (pages adopted at arrival could be evicted again while the
request queues on the modelled clock) and drains, so the same trace gives the same hits.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence

import torch

from hicache.engine.memory import SlotBudget
from hicache.radix import CheckpointPolicy, HybridRadixCache, RadixKey
from hicache.replay.cost import CostModel
from hicache.replay.live import LiveRequest, Record
from hicache.replay.states import StateTracker
from hicache.stack import KVStack


class Replayer:
    """Replay requests (arrival order) through ``stack``'s cache under ``cost``'s clock."""

    def __init__(
        self,
        stack: KVStack,
        cost: CostModel,
        *,
        max_running: int,
        max_prefill_tokens: int,
        token_bytes: int,
        state_bytes: int = 0,
    ) -> None:
        self.stack, self.cache, self.cost = stack, stack.cache, cost
        self.budget = SlotBudget(stack.cache, stack.allocator, stack.req_to_token_pool)
        self.max_running, self.max_prefill_tokens = max_running, max_prefill_tokens
        self.token_bytes, self.state_bytes = token_bytes, state_bytes
        cache = stack.cache
        self.hybrid = isinstance(cache, HybridRadixCache)
        self.policy: CheckpointPolicy | None = None  # a recurrent model's
        if isinstance(cache, HybridRadixCache) and cache.hybrid.recurrent:
            self.policy = cache.hybrid.checkpoint
        self.states = None if self.policy is None else StateTracker(cache)
        self.storage = stack.cache.stats().storage is not None
        self.on_record: Callable[[Record], None] | None = None
        self.now = 0.0
        self.arrivals: deque[LiveRequest] = deque()
        self.waiting: deque[LiveRequest] = deque()
        self.decoding: list[LiveRequest] = []
        self.prefilling: LiveRequest | None = None
        self.records: list[Record] = []

    def run(
        self, requests: Sequence[LiveRequest], on_record: Callable[[Record], None] | None = None
    ) -> list[Record]:
        """Replay every request; returns one record per request, in finishing order."""
        self.arrivals.extend(requests)
        self.on_record = on_record
        while self.arrivals or self.waiting or self.decoding or self.prefilling:
            self._arrive()
            if not (self.waiting or self.decoding or self.prefilling):
                if self.arrivals:  # idle until the next arrival (none: all were rejected)
                    self.now = max(self.now, self.arrivals[0].arrival_s)
                continue
            self.step()
        return self.records

    def step(self) -> None:
        """One iteration (or several decode-only ones); see the module docstring."""
        self.cache.check_hicache_events()
        batch = list(self.decoding)
        prefilled, tokens, loaded, read = self._prefill()
        steps = 1 if tokens or not batch else self._decode_only_steps(batch)
        tb = self.token_bytes
        states = 0 if self.states is None else self.states.take_loaded()
        load = loaded * tb + states * self.state_bytes
        dt = self.cost.step_seconds(tokens, bool(batch), load, read * tb)
        self.now += dt if steps == 1 else steps * self.cost.decode_step_s
        for req in prefilled:
            req.first_token_s = self.now
        for req in batch:
            req.decode_left -= steps
        for req in [r for r in batch if r.decode_left == 0] + [
            r for r in prefilled if r.decode_left == 0
        ]:
            self._finish(req)
        if self.states is not None:
            self.states.sample()

    @property
    def running(self) -> int:
        return len(self.decoding) + (self.prefilling is not None)

    def _arrive(self) -> None:
        while self.arrivals and self.arrivals[0].arrival_s <= self.now:
            req = self.arrivals.popleft()
            need, size = self.budget.round_up(req.kv_total), self.stack.allocator.size
            if need <= size:
                self.waiting.append(req)
            else:
                reason = f"needs {need} KV slots; the device pool holds {size}"
                self._emit(req.record(None, reason))

    def _prefill(self) -> tuple[list[LiveRequest], int, int, int]:
        """This iteration's prompt chunks: (requests whose prompt finished, tokens computed,
        tokens loaded from the host, tokens read from storage to the host before that)."""
        left, done, loaded, read = self.max_prefill_tokens, [], 0, 0
        while left > 0:
            if self.prefilling is None:
                self.prefilling = self._admit_next()
                if self.prefilling is None:
                    break
                loaded += self.prefilling.host_hit + self.prefilling.storage_hit
                read += self.prefilling.storage_hit
            req = self.prefilling
            n = self._chunk(req, left)
            req.to_compute -= n
            left -= n
            if self.hybrid or req.to_compute == 0:
                req.kv_len = req.trace.input_length - req.to_compute
                self.budget.state_room(finished=False)
                self.cache.cache_unfinished_req(req)
            if req.to_compute == 0:
                self.decoding.append(req)
                done.append(req)
                self.prefilling = None
        return done, self.max_prefill_tokens - left, loaded, read

    def _chunk(self, req: LiveRequest, limit: int) -> int:
        """Tokens of ``req``'s next chunk: at most ``limit``, ending where a recurrent
        model's checkpoint policy takes a state (the engine's ``Scheduler._chunk``)."""
        n = min(limit, req.to_compute)
        if self.policy is None:
            return n
        prompt, page = req.trace.input_length, self.budget.page_size
        done, finish_at = prompt - req.to_compute, prompt - prompt % page if prompt % page else None
        return self.policy.chunk_tokens(done, n, req.mamba_branching_seqlen, finish_at)

    def _decode_only_steps(self, batch: list[LiveRequest]) -> int:
        """How many decode-only iterations pass before the next event."""
        steps = min(r.decode_left for r in batch)
        if self.arrivals and self.running < self.max_running and self.cost.decode_step_s > 0:
            gap = self.arrivals[0].arrival_s - self.now
            steps = min(steps, max(1, math.ceil(gap / self.cost.decode_step_s)))
        return steps

    def _admit_next(self) -> LiveRequest | None:
        if not self.waiting or self.running >= self.max_running:
            return None
        req = self.waiting[0]
        admitted = self._admit(req)
        if not admitted and self.running == 0:
            self.cache.drain_transfers()  # only transfers in flight hold slots now
            self.cache.check_hicache_events()
            admitted = self._admit(req)
            if not admitted:
                raise RuntimeError(f"request {req.rid} cannot be admitted into an idle cache")
        if not admitted:
            return None
        req.admitted_s = self.now
        return self.waiting.popleft()

    def _admit(self, req: LiveRequest) -> bool:
        """Match, lock, check the budget, load back a host hit, take the request's slots."""
        key = RadixKey.from_validated(req.origin_input_ids[:-1], None)
        if self.storage and not req.prefetched:
            req.prefetched = True
            req.storage_hit = self._prefetch(str(req.rid), key)
        admitted = self.budget.admit(key, req.kv_total, ())
        if admitted is None:
            return False
        row, prefix, node, m = admitted
        if m.host_hit_length > 0:
            self.cache.consume_load_batch(self.cache.ready_to_load_host_cache())
        total = self.budget.round_up(req.kv_total)
        rest = self.budget.alloc(total - len(prefix))
        if rest is None:
            raise RuntimeError(f"out of KV slots for request {req.rid} within its budget")
        slots = torch.cat([prefix.to(rest.device), rest]).to(torch.int32)
        self.stack.req_to_token_pool.write((row, slice(0, total)), slots)
        req.req_pool_idx, req.prefix_indices, req.last_node = row, prefix, node
        req.kv_len = req.cache_protected_len = len(prefix)
        req.kv_capacity = total
        loaded = len(prefix) - m.device_prefix_len
        req.storage_hit = min(req.storage_hit, loaded)  # what the prefetch added, if still there
        req.device_hit, req.host_hit = m.device_prefix_len, loaded - req.storage_hit
        req.to_compute = req.trace.input_length - len(prefix)
        req.decode_left = max(req.trace.output_length - 1, 0)
        req.mamba_branching_seqlen = getattr(m, "mamba_branching_seqlen", None)
        return True

    def _prefetch(self, rid: str, key: RadixKey) -> int:
        """Read from storage what device and host miss of ``key`` (see the module docstring);
        the tokens it added to the tree as host-only nodes."""
        cache = self.cache
        cache.drain_transfers()
        m = cache.match_prefix(key)
        hit = m.device_prefix_len + m.host_hit_length
        if not cache.prefetch_from_storage(rid, m.last_host_node, key[hit:]):
            return 0
        cache.drain_transfers()
        if not cache.check_prefetch_progress(rid):
            raise RuntimeError(f"the storage prefetch of request {rid} still runs after a drain")
        return int(cache.pop_prefetch_loaded_tokens(rid))

    def _finish(self, req: LiveRequest) -> None:
        """Hand the prompt to the cache, free the decode slots past its last page."""
        row = req.req_pool_idx
        assert row is not None, "a running request holds a row"
        start = self.budget.round_up(req.trace.input_length)
        table = self.stack.req_to_token_pool.req_to_token
        decode = table[row, start : req.kv_capacity].to(torch.int64)
        self.budget.state_room(finished=True)
        self.cache.cache_finished_req(req)
        if len(decode):
            self.stack.allocator.free(decode)
        self.decoding.remove(req)
        req.release()
        self._emit(req.record(self.now))

    def _emit(self, record: Record) -> None:
        self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)
