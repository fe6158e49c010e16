"""A minimal continuous-batching engine that embeds a (hierarchical) radix cache.

Each ``step``:

1. ``cache.check_hicache_events()`` — retire finished host writes/loads (a no-op without a
   host tier).
2. Plan: with a storage tier, a request that arrived is matched and ``prefetch_from_storage``
   asked for the rest of its prompt; decoding requests take one token each; waiting requests
   are admitted FIFO, passing over those whose prefetch still runs (``check_prefetch_progress``)
   (``match_prefix``, ``init_load_back`` for host hits, prefetched pages included, slots
   allocated with eviction when short) and prompts are cut into chunks within
   ``max_prefill_tokens``.
3. ``ready_to_load_host_cache()`` issues the queued loads layer by layer, and
   ``consume_load_batch(...)`` makes this step's attention wait per layer.
4. One forward over the mixed batch; greedy sampling; with a storage tier
   (``cache.has_storage_tier()``), ``note_prefill(tokens, seconds)`` with the prompt tokens it
   computed and its wall time (the storage tier's cost model).
5. ``cache_unfinished_req`` after every prompt chunk, ``cache_finished_req`` when a request ends
   (alone when it ends in the step that ends its prompt, as SGLang's scheduler does).

The storage hooks are no-ops without a storage tier (``BasePrefixCache``).

Under tensor parallelism (``cache.tp``, a ``hicache.tp.TPGroup`` of more than one rank) every
rank runs this same loop over its shard of the model and pools: the same cache calls in the
same order with the same arguments. What is rank-local is agreed: the slot budget's
allocations (``SlotBudget``; a prefill step with a host hit takes 3 collectives: admission
with its load-back, the step's slots with the load issue's settle, the backup's host slots),
the prefill time given to ``note_prefill`` (the slowest rank's; agreed only with a storage
tier, whose cost model reads it) and the stall timeout. Logits are
equal on every rank (the model all-reduces), so greedy sampling picks the same tokens. Any
step may raise ``hicache.tp.TPPeerError`` (another rank failed at an agreement point) or
``TPError`` (the group is broken). See docs/tp.md.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from hicache.engine.agreed import slowest
from hicache.engine.checks import check_parts, check_submission
from hicache.engine.config import EngineConfig
from hicache.engine.memory import SlotBudget
from hicache.engine.request import Request, Status
from hicache.engine.scheduler import Plan, Scheduler, Work
from hicache.model import ForwardBatch, TinyTransformer
from hicache.pools import HybridReqToTokenPool, ReqToTokenPool, TokenToKVPoolAllocator
from hicache.threads import ThreadBound

IDLE_WAIT_S = 0.001  # a step with nothing to run but prefetches in flight sleeps this long


class Engine(ThreadBound):
    """Serve generation requests with a model whose KV lives in ``allocator.get_kvcache()``.

    Parameters
    ----------
    model : the transformer; its KV pool is ``allocator.get_kvcache()``.
    cache : ``RadixCache`` or ``HiRadixCache`` over ``req_to_token_pool`` and ``allocator``;
        for a hybrid model a ``HybridRadixCache`` (``engine.hybrid``), whose request pool is a
        ``HybridReqToTokenPool`` when the model has ``L`` layers (the forward's ``states``).
    config : batching settings (default ``EngineConfig()``).

    ``TypeError``/``ValueError`` when the parts do not fit together (``checks.check_parts``).
    One thread drives it (``hicache.threads``): ``submit``, ``abort``, ``step`` and ``run`` raise
    ``RuntimeError`` from another; ``bind_thread()`` hands the engine, its cache and pools over.
    """

    thread_guarded = "submit abort step run"

    def __init__(
        self,
        model: TinyTransformer,
        cache: Any,
        req_to_token_pool: ReqToTokenPool,
        allocator: TokenToKVPoolAllocator,
        config: EngineConfig | None = None,
    ) -> None:
        check_parts(model, cache, req_to_token_pool, allocator, config)
        self.model, self.cache, self.config = model, cache, config or EngineConfig()
        self.req_to_token_pool, self.allocator = req_to_token_pool, allocator
        self.kv_pool = allocator.get_kvcache()
        states = req_to_token_pool
        self.states = states if isinstance(states, HybridReqToTokenPool) else None
        self.tp = cache.tp
        self.budget = SlotBudget(cache, allocator, req_to_token_pool)
        self.scheduler = Scheduler(cache, self.budget, self.config)
        self._rids = itertools.count()
        self.forward_passes = 0
        self._stalled_since: float | None = None
        self._prefetch_mark: tuple[int, int] = (0, 0)

    def submit(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        extra_key: Hashable | None = None,
        arrival: float | None = None,
        cache_salt: str | None = None,
    ) -> Request:
        """Queue a request; nothing changes when an argument is refused.

        Parameters
        ----------
        prompt : non-empty sequence of ints (or integer numpy array / tensor) in ``[0, vocab)``.
        max_new_tokens : int ``>= 1``.
        extra_key : namespace of the request's cache entries (see ``RadixKey``).
        arrival : ``time.perf_counter()`` seconds, the TTFT origin (default now).
        cache_salt : tenant salt (a str) or None; requests of different salts never share
            cached KV, in any tier (``request_namespace``).

        Raises ``TypeError`` for an argument of the wrong type (bools, floats or strings as
        token ids, a float ``max_new_tokens``, an ``extra_key`` outside ``check_extra_key``'s
        types, a non-str ``cache_salt``) and ``ValueError`` for one out of range, naming it. A
        request too long for the pools is returned ``REJECTED`` (with ``error`` set) by the
        next ``step``.
        """
        vocab = self.model.cfg.vocab_size
        args = check_submission(prompt, max_new_tokens, extra_key, arrival, vocab, cache_salt)
        now = time.perf_counter() if args.arrival is None else args.arrival
        req = Request(
            next(self._rids),
            args.prompt,
            args.max_new_tokens,
            args.namespace,
            cache_salt=args.cache_salt,
            arrival=now,
        )
        self.scheduler.submit(req)
        return req

    def abort(self, req: Request) -> bool:
        """Withdraw a waiting request: it holds nothing and its storage prefetch is released
        (``release_aborted_request``); the next ``step`` returns it ``ABORTED``. False, with no
        change, for a request that is not waiting (admitted requests run to the end)."""
        if not isinstance(req, Request):
            raise TypeError(f"req must be a Request, got {type(req).__name__}")
        return self.scheduler.abort(req)

    def bind_thread(self) -> None:
        """Make the calling thread the driver of the engine, its cache and its pools."""
        super().bind_thread()
        for part in (self.cache, self.req_to_token_pool, self.allocator):
            part.bind_thread()

    def has_work(self) -> bool:
        s = self.scheduler
        return bool(s.waiting or s.active or s.rejected)

    def step(self) -> list[Request]:
        """Run one iteration; returns the requests that finished or were rejected in it.

        Raises ``RuntimeError`` when waiting requests could not be admitted for
        ``stall_timeout_s`` although nothing is running and no storage prefetch started,
        finished or read a byte (a bookkeeping bug or a prefetch that never ends, never load).
        """
        done, self.scheduler.rejected = self.scheduler.rejected, []
        self.cache.check_hicache_events()
        plan = self.scheduler.plan()
        work = plan.work
        self._check_stall(bool(work))
        if not work:
            if self.scheduler.prefetching:
                time.sleep(IDLE_WAIT_S)  # leave the CPU to the prefetch I/O
            return done
        start = time.perf_counter()
        logits = self._forward(plan)
        tokens = logits.argmax(dim=-1).tolist()  # waits for the forward pass
        prefill = sum(len(w.input_ids) for w in work if w.req.status is Status.PREFILL)
        if prefill and self.cache.has_storage_tier():  # only the storage tier's cost model reads it
            seconds = slowest(self.tp, time.perf_counter() - start, where="engine prefill time")
            self.cache.note_prefill(prefill, seconds)
        return done + self._advance(work, tokens, logits)

    def run(self) -> list[Request]:
        """Step until every submitted request is finished or rejected; returns them all."""
        finished: list[Request] = []
        while self.has_work():
            finished += self.step()
        return finished

    def _check_stall(self, progressed: bool) -> None:
        """``RuntimeError`` on every rank once any rank has seen no progress for
        ``stall_timeout_s``; the agreement runs only at steps that ran nothing while requests
        wait and none is active (the same steps on every rank)."""
        s = self.scheduler
        if progressed or s.active or not s.waiting:
            self._stalled_since = None
            return
        now = time.perf_counter()
        since = None if self._prefetch_moved() else self._stalled_since or now
        self._stalled_since = since
        expired = since is not None and now - since > self.config.stall_timeout_s
        if not self.tp.all_ok(not expired, where="engine stall check"):
            raise RuntimeError("engine stalled: a waiting request can never be admitted")

    def _prefetch_moved(self) -> bool:
        """Whether a prefetch started or finished, or storage read bytes, since last asked."""
        if not self.scheduler.prefetching:
            return False
        storage = self.cache.stats().storage
        mark = (self.scheduler.prefetch_events, 0 if storage is None else storage.bytes_read)
        moved, self._prefetch_mark = mark != self._prefetch_mark, mark
        return moved

    def _forward(self, plan: Plan) -> torch.Tensor:
        work = plan.work
        rows = [w.req.req_pool_idx for w in work]
        assert None not in rows, "a scheduled request holds a row"
        loads = self.cache.ready_to_load_host_cache()  # first: they start while the batch builds
        slots = plan.slots  # agreed with the loads' settle (``SlotBudget.confirm``)
        if not self.budget.confirm():
            slots = self.budget.new_slots([(w.req, len(w.input_ids)) for w in work])
        batch = ForwardBatch.build(
            self.req_to_token_pool.req_to_token,
            [row for row in rows if row is not None],
            [w.req.kv_len for w in work],
            [w.input_ids for w in work],
            slots,
            self.model.device,
        )
        self.cache.consume_load_batch(loads)
        self.forward_passes += 1
        return self.model(batch, self.kv_pool, False, self.states)

    def _advance(self, work: list[Work], tokens: list[int], logits: torch.Tensor) -> list[Request]:
        hybrid = self.budget.hybrid
        if hybrid is not None and hybrid.tracking:  # before any request of the step finishes
            hybrid.track([(w.req, len(w.input_ids)) for w in work])
        finished = []
        for w, token, row in zip(work, tokens, logits, strict=True):
            req = w.req
            req.kv_len += len(w.input_ids)
            if req.status is Status.PREFILL:
                req.computed += len(w.input_ids)
                # a request that ends with this token goes to cache_finished_req alone (SGLang)
                if not (req.prompt_done and len(req.output_ids) + 1 >= req.max_new_tokens):
                    self.budget.state_room(finished=False)
                    self.cache.cache_unfinished_req(req, trusted=True)  # rows are ours
                if not req.prompt_done:
                    continue
                req.status, req.first_token_time = Status.DECODE, time.perf_counter()
            req.output_ids.append(token)
            if self.config.record_logits:
                req.logits.append(row)
            if req.done:
                finished.append(self._finish(req))
        return finished

    def _finish(self, req: Request) -> Request:
        self.budget.state_room(finished=True)
        self.cache.cache_finished_req(req, trusted=True)
        req.status, req.finish_time = Status.FINISHED, time.perf_counter()
        self.scheduler.retire(req)
        return req
