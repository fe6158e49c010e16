"""A minimal continuous-batching engine that embeds a (hierarchical) radix cache.

Each ``step``:

1. ``cache.check_hicache_events()`` — retire finished host writes/loads (a no-op without a
   host tier).
2. Plan: decoding requests take one token each; waiting requests are admitted FIFO
   (``match_prefix``, ``init_load_back`` for host hits, slots allocated with eviction when short)
   and prompts are cut into chunks within ``max_prefill_tokens``.
3. ``ready_to_load_host_cache()`` issues the queued loads layer by layer, and
   ``consume_load_batch(...)`` makes this step's attention wait per layer.
4. One forward over the mixed batch; greedy sampling.
5. ``cache_unfinished_req`` after every prompt chunk, ``cache_finished_req`` when a request ends.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from hicache.engine.checks import check_parts, check_submission
from hicache.engine.config import EngineConfig
from hicache.engine.memory import SlotBudget
from hicache.engine.request import Request, Status
from hicache.engine.scheduler import Scheduler, Work
from hicache.model import ForwardBatch, TinyTransformer
from hicache.pools import ReqToTokenPool, TokenToKVPoolAllocator


class Engine:
    """Serve generation requests with a model whose KV lives in ``allocator.get_kvcache()``.

    Parameters
    ----------
    model : the transformer; its KV pool is ``allocator.get_kvcache()``.
    cache : ``RadixCache`` or ``HiRadixCache`` over ``req_to_token_pool`` and ``allocator``.
    config : batching settings (default ``EngineConfig()``).

    ``TypeError``/``ValueError`` when the parts do not fit together (``checks.check_parts``).
    """

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
        self.budget = SlotBudget(cache, allocator, req_to_token_pool)
        self.scheduler = Scheduler(cache, self.budget, self.config)
        self._rids = itertools.count()
        self.forward_passes = 0
        self._stalled_since: float | None = None

    def submit(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        extra_key: Hashable | None = None,
        arrival: float | None = None,
    ) -> Request:
        """Queue a request; nothing changes when an argument is refused.

        Parameters
        ----------
        prompt : non-empty sequence of ints (or integer numpy array / tensor) in ``[0, vocab)``.
        max_new_tokens : int ``>= 1``.
        extra_key : namespace of the request's cache entries (see ``RadixKey``).
        arrival : ``time.perf_counter()`` seconds, the TTFT origin (default now).

        Raises ``TypeError`` for an argument of the wrong type (bools, floats or strings as
        token ids, a float ``max_new_tokens``, an ``extra_key`` outside ``check_extra_key``'s
        types) and ``ValueError`` for one out of range, naming it. A request too long for the
        pools is returned ``REJECTED`` (with ``error`` set) by the next ``step``.
        """
        args = check_submission(
            prompt, max_new_tokens, extra_key, arrival, self.model.cfg.vocab_size
        )
        now = time.perf_counter() if args.arrival is None else args.arrival
        req = Request(
            next(self._rids), args.prompt, args.max_new_tokens, args.extra_key, arrival=now
        )
        self.scheduler.submit(req)
        return req

    def has_work(self) -> bool:
        s = self.scheduler
        return bool(s.waiting or s.active or s.rejected)

    def step(self) -> list[Request]:
        """Run one iteration; returns the requests that finished or were rejected in it.

        Raises ``RuntimeError`` when waiting requests could not be admitted for
        ``stall_timeout_s`` although nothing is running (a bookkeeping bug, never load).
        """
        done, self.scheduler.rejected = self.scheduler.rejected, []
        self.cache.check_hicache_events()
        work = self.scheduler.plan()
        self._check_stall(bool(work))
        if not work:
            return done
        logits = self._forward(work)
        return done + self._advance(work, logits)

    def run(self) -> list[Request]:
        """Step until every submitted request is finished or rejected; returns them all."""
        finished: list[Request] = []
        while self.has_work():
            finished += self.step()
        return finished

    def _check_stall(self, progressed: bool) -> None:
        if progressed or self.scheduler.active or not self.scheduler.waiting:
            self._stalled_since = None
            return
        now = time.perf_counter()
        self._stalled_since = self._stalled_since or now
        if now - self._stalled_since > self.config.stall_timeout_s:
            raise RuntimeError("engine stalled: a waiting request can never be admitted")

    def _forward(self, work: list[Work]) -> torch.Tensor:
        rows = [w.req.req_pool_idx for w in work]
        assert None not in rows, "a scheduled request holds a row"
        batch = ForwardBatch.build(
            self.req_to_token_pool.req_to_token,
            [row for row in rows if row is not None],
            [w.req.kv_len for w in work],
            [w.input_ids for w in work],
            torch.cat([w.slots for w in work]),
            self.model.device,
        )
        self.cache.consume_load_batch(self.cache.ready_to_load_host_cache())
        self.forward_passes += 1
        return self.model(batch, self.kv_pool)

    def _advance(self, work: list[Work], logits: torch.Tensor) -> list[Request]:
        tokens = logits.argmax(dim=-1).tolist()
        finished = []
        for w, token, row in zip(work, tokens, logits, strict=True):
            req = w.req
            req.kv_len += len(w.input_ids)
            if req.status is Status.PREFILL:
                req.computed += len(w.input_ids)
                self.cache.cache_unfinished_req(req)
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
        self.cache.cache_finished_req(req)
        req.status, req.finish_time = Status.FINISHED, time.perf_counter()
        self.scheduler.retire(req)
        return req
