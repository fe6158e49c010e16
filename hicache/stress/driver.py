"""A seeded scheduler stand-in that drives a HiRadixCache through random operations.

It follows the serving protocol of ``hicache.radix.req``: match a prompt, load back its host
part, lock, allocate the rest, issue the loads, run the "model" (write the oracle's KV), cache
chunks as they finish, then finish or abort. Around it: peeks, lock/unlock, explicit device
and host eviction, event polling and whole-cache resets. Every request that uses a prefix first
checks that the prefix's KV bytes are right: a node whose load failed is never served.
Under TP each rank runs one driver over the same op stream (faults have their own rng); its
allocations go through ``cache.tp.all_ok``; a ``TPPeerError`` is handled like a fault.
"""

from __future__ import annotations

import random
from collections import Counter
from functools import partial
from typing import Any

import torch

from hicache.radix import RadixKey, Req
from hicache.stress import checker
from hicache.stress.config import MAX_LIVE, StressConfig, build_cache, build_stack
from hicache.stress.faults import STEP_FAULTS, Faults
from hicache.stress.live import Live, start_request
from hicache.stress.oracle import write_kv
from hicache.stress.tracker import Tracker
from hicache.stress.workload import SALTS, Turn, Workload


class Driver:
    """Owns the cache under test, the workload and the bookkeeping of live requests and locks.
    ``tp_group`` goes to ``HiRadixCache``; ``faults`` (installed by the caller) defaults to
    ``cfg``'s rates over both pools and transfers, drawn from their own seeded rng."""

    def __init__(
        self, cfg: StressConfig, *, tp_group: Any = None, faults: Faults | None = None
    ) -> None:
        self.cfg, self.rng = cfg, random.Random(cfg.seed)
        self.stack = build_stack(cfg)
        self.all_device = self.stack.slot_allocator.free_slots()
        self.cache = build_cache(cfg, self.stack, tp_group)
        self.host_pool = self.cache.cache_controller.mem_pool_host
        self.all_host = self.host_pool.free_slots()
        self.pool = self.stack.device_pool
        self.workload = Workload(self.rng, cfg.unit, cfg.max_context, cfg.conversations)
        self.faults = faults or Faults(random.Random(f"faults {cfg.seed}"), *cfg.fault_rates)
        self.live: list[Live] = []
        self.locks: list[Any] = []
        self.counts: Counter[str] = Counter()
        self.violations: list[str] = []
        self.tracker = Tracker(
            self.cache,
            self.stack.slot_allocator,
            self.host_pool,
            self.stack.req_pool,
            self.all_device,
            self.all_host,
            self.cache.host_tier.reserved,
        )
        if faults is None:
            self._install_faults()

    def _install_faults(self) -> None:
        self.faults.flaky_alloc(self.stack.allocator, "device_alloc_none")
        self.faults.flaky_alloc(self.host_pool, "host_alloc_none")
        self.faults.failing_load(self.host_pool)
        self.faults.failing_backup(self.host_pool)

    # ---- requests ----------------------------------------------------------------------------

    def idle(self, op: str) -> bool:
        """``op`` has nothing to act on: it would not touch the cache (nor need a check)."""
        if op in ("advance", "abort"):
            return not self.live
        return len(self.live) >= MAX_LIVE if op == "admit" else op == "unlock" and not self.locks

    def admit(self) -> None:
        if self.idle("admit"):
            return
        turn = self.workload.next_turn()
        if turn is None:
            return
        node = slots = None
        try:
            prefix, node = self._match_and_load(turn)
            target = len(turn.prompt) + len(turn.output) - 1
            slots = self._alloc(self._ceil(target - len(prefix)))
            if slots is None:
                return self._reject(turn, node, "rejected_no_memory")
            producer = self.cache.ready_to_load_host_cache()
        except STEP_FAULTS:
            if slots is not None:
                self.stack.allocator.free(slots)
            return self._reject(turn, node, "rejected_fault")
        if producer >= 0:
            self.cache.consume_load_batch(producer)
        self._expect(checker.check_prefix(self.pool, prefix, turn.prompt, turn.conversation.salt))
        new = start_request(self.stack.req_pool, turn, prefix, node, slots, target)
        self._compute(new, self.rng.randint(len(prefix), target))
        self.live.append(new)

    def _match_and_load(self, turn: Turn) -> tuple[torch.Tensor, Any]:
        """Match the prompt, load its host part back, lock: (prefix slots, locked node)."""
        tenant = turn.conversation.tenant
        m = self.cache.match_prefix(RadixKey(turn.prompt, tenant))
        self._expect(checker.namespace(checker.path_to(self.cache, m.last_host_node), tenant))
        prefix, node = m.device_indices, m.last_device_node
        if m.host_hit_length > 0:
            loaded, node = self.cache.init_load_back(m.last_host_node, m.host_hit_length)
            prefix = torch.cat([prefix, loaded.to(prefix.device)])
            self.counts["load_back"] += int(loaded.numel() > 0)
        self.cache.inc_lock_ref(node)
        return prefix, node

    def advance(self) -> None:
        if self.idle("advance"):
            return
        live = self.rng.choice(self.live)
        if live.req.kv_len < live.target:
            if self.rng.random() < 0.7:
                self._completes(self.cache.cache_unfinished_req, live.req)
                self.counts["cache_unfinished_req"] += 1
            self._compute(live, self.rng.randint(live.req.kv_len + 1, live.target))
            return
        self._finish(live, completed=True)

    def _compute(self, live: Live, end: int) -> None:
        """The model's forward over ``live``'s positions ``[kv_len, end)``."""
        live.compute(partial(write_kv, self.pool), end)

    def abort(self) -> None:
        if self.idle("abort"):
            return
        live = self.rng.choice(self.live)
        if self.rng.random() < 0.5:
            return self._finish(live, completed=False)
        self.stack.allocator.free(live.own())
        self.stack.req_pool.free(live.req.req_pool_idx)
        assert live.req.last_node is not None, "a live request holds a lock"
        self.cache.dec_lock_ref(live.req.last_node)
        self._drop(live, completed=False)

    def _finish(self, live: Live, completed: bool) -> None:
        """``cache_finished_req``; then free the pages past ``kv_len``'s last page ourselves."""
        self._completes(self.cache.cache_finished_req, live.req)
        beyond = self._ceil(live.req.kv_len) - live.base
        self.stack.allocator.free(live.slots[max(beyond, 0) :])
        self._drop(live, completed)

    def _drop(self, live: Live, completed: bool) -> None:
        self.live.remove(live)
        self.workload.finish(live.turn, completed)
        self.counts["finished" if completed else "aborted"] += 1

    def _completes(self, call: Any, req: Req) -> None:
        """``cache_*_req``: the request's part is done before queued writes are issued, so an
        injected write failure surfaces after it completed (the batch stays queued)."""
        try:
            call(req)
        except STEP_FAULTS:
            self.counts["write_failed_after_cache_req"] += 1

    def _reject(self, turn: Turn, node: Any, reason: str) -> None:
        if node is not None:
            self.cache.dec_lock_ref(node)
        self.workload.finish(turn, completed=False)
        self.counts[reason] += 1

    def _alloc(self, n: int) -> torch.Tensor | None:
        """Like a scheduler: allocate; on a shortfall (any rank's) evict it once and retry."""
        slots = self._alloc_agreed(n, "driver alloc")
        if slots is None:
            self.counts["evicted_for_alloc"] += self.cache.evict(n)
            slots = self._alloc_agreed(n, "driver alloc after evict")
        return slots

    def _alloc_agreed(self, n: int, where: str) -> torch.Tensor | None:
        """``n`` device slots if every rank got them, else None (nothing held)."""
        allocator = self.stack.allocator
        return self.cache.tp.keep_if_all(allocator.alloc(n), allocator.free, where=where)

    def _ceil(self, n: int) -> int:
        page = self.cfg.page_size
        return -(-n // page) * page

    # ---- the rest of the API ------------------------------------------------------------------

    def peek(self) -> Any:
        tenant, prefix = self.workload.random_prefix()
        m = self.cache.match_prefix(RadixKey(prefix, tenant))
        self._expect(checker.namespace(checker.path_to(self.cache, m.last_host_node), tenant))
        loading, _ = checker.pending(self.cache.cache_controller)
        self._expect(self._check_match(m, prefix, SALTS[tenant], loading))
        return m.last_device_node

    def _check_match(self, m: Any, ids: list[int], salt: int, skip: torch.Tensor) -> list[str]:
        """A peek's match: its device prefix holds ``ids``' KV (``skip``: still loading)."""
        return checker.check_prefix(self.pool, m.device_indices, ids, salt, skip)

    def lock(self) -> None:
        node = self.peek()
        if node is not self.cache.root:
            self.cache.inc_lock_ref(node)
            self.locks.append(node)

    def unlock(self) -> None:
        if not self.idle("unlock"):
            self.cache.dec_lock_ref(self.locks.pop(self.rng.randrange(len(self.locks))))

    def evict(self) -> None:
        self.counts["evicted"] += self.cache.evict(self.rng.randint(1, 2 * self.cfg.unit))

    def evict_host(self) -> None:
        self.counts["host_evicted"] += self.cache.evict_host(self.rng.randint(1, 2 * self.cfg.unit))

    def events(self) -> None:
        self.cache.check_hicache_events()
        self.cache.ready_to_load_host_cache()

    def reset(self) -> None:
        """Abort every request, drop every lock, reset: both tiers must come back empty."""
        while self.live:
            live = self.live[0]
            self.stack.allocator.free(live.own())
            self.stack.req_pool.free(live.req.req_pool_idx)
            assert live.req.last_node is not None, "a live request holds a lock"
            self.cache.dec_lock_ref(live.req.last_node)
            self._drop(live, completed=False)
        while self.locks:
            self.cache.dec_lock_ref(self.locks.pop())
        self.cache.reset()
        self.counts["reset"] += 1
        sizes = (self.stack.slot_allocator.available_size(), self.host_pool.available_size())
        if sizes != (self.all_device.numel(), self.all_host.numel()):
            self.violations.append("reset left slots allocated")

    # ---- checks -------------------------------------------------------------------------------

    def drain(self) -> None:
        """Faults off; issue every queued transfer and let every ack be processed."""
        self.faults.enabled = False
        checker.pending(self.cache.cache_controller)  # synchronizes CUDA
        self.events()
        checker.pending(self.cache.cache_controller)
        self.events()

    def audit_locks(self) -> None:
        """With no transfer pending, every lock is one the driver holds (nothing leaked)."""
        held: Counter[int] = Counter()
        for node in [live.req.last_node for live in self.live] + self.locks:
            held.update(n.id for n in checker.path_to(self.cache, node))
        for node, _ in checker.walk(self.cache):
            if node.lock_ref != held[node.id]:
                self.violations.append(
                    f"node {node.id}: lock_ref {node.lock_ref} but the driver "
                    f"holds {held[node.id]} locks through it (leaked lock)"
                )

    def _expect(self, problems: list[str]) -> None:
        self.violations.extend(problems)

    def _held(self) -> tuple[list[torch.Tensor], Counter[int]]:
        """(device slots each live request owns, node id -> locks the driver took on it)."""
        nodes = [live.req.last_node for live in self.live] + self.locks
        return [live.own() for live in self.live], Counter(n.id for n in nodes if n is not None)

    def _sweep(self, requests: list[torch.Tensor]) -> list[str]:  # every cached token's bytes
        return checker.sweep(self.cache)

    def check(self) -> None:
        """After an op: what it changed (see :mod:`hicache.stress.tracker`)."""
        with self.faults.paused():
            self._expect(self.tracker.check(*self._held()))

    def check_full(self) -> None:
        """Everything: the cache's own ``check_invariants``, slot ownership from scratch, every
        cached token's KV bytes, then the tracker re-based on (and checking) the whole tree."""
        with self.faults.paused():
            try:
                self.cache.check_invariants()
            except RuntimeError as err:
                self.violations.append(f"check_invariants: {err}")
            requests, locks = self._held()
            self._expect(
                checker.ownership(
                    self.cache,
                    self.stack.slot_allocator,
                    self.host_pool,
                    requests,
                    self.all_device,
                    self.all_host,
                    self.cache.host_tier.reserved(),
                )
            )
            self._expect(self._sweep(requests))
            self.tracker.reset()
            self._expect(self.tracker.check(requests, locks, verify=False))
