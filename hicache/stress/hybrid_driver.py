"""The stress driver of a hybrid model (``StressConfig.layers_pattern``): a
``HybridHiRadixCache`` over ``make_model_pools``' pools, driven as the engine drives it.

A request follows ``hicache.engine.memory.SlotBudget.admit``: match, lock, take a row (with a
fresh state slot: ``HybridMemory.alloc_row``, a state evicted first when none is free), load the
host hit back (``load_back``), restore the state after the prefix into the row
(``HybridMemory.restore``), then allocate its slots (SWA tombstones first when the SWA pool is
short: ``swa_room``). Before serving, the prefix must be usable (``check_served``). The
"model" writes every attention layer's KV (``write_kv_hybrid``) and sets the row's state to
the state after the tokens computed (``write_state``); ``cache_*_req`` checkpoint it as the
policy says, after ``state_room``, and, at pages over one token, from the state tracked at the
last page boundary a forward crossed (the engine's decode tracking). Besides the plain ops it
tombstones SWA KV (``evict_swa``) and evicts recurrent states (``evict_states``).

After every op the tracker checks ownership, structure and locks and :func:`sweep_hybrid`
every cached byte and state; a full check adds ``check_invariants`` (the components' and host
components' checkers included), slot ownership of every pool (full, SWA, device and host
states) and the allocator's own invariants.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from hicache.engine.hybrid import TRACK_SLOTS, HybridMemory
from hicache.engine.memory import load_back
from hicache.radix import RadixKey
from hicache.stress import checker
from hicache.stress.config import StressConfig
from hicache.stress.driver import Driver
from hicache.stress.faults import STEP_FAULTS, Faults
from hicache.stress.hybrid_checks import (
    Parts,
    check_served,
    state_ownership,
    swa_ownership,
    sweep_hybrid,
)
from hicache.stress.hybrid_oracle import state_code, write_kv_hybrid, write_state
from hicache.stress.hybrid_storage import Prefetches, install_storage_faults
from hicache.stress.live import Live, StateReq, start_request
from hicache.stress.workload import Turn


class HybridDriver(Driver):
    """A :class:`Driver` of a hybrid model; see the module docstring."""

    cache: Any  # a HybridHiRadixCache
    host_pool: Any  # its HybridKVPoolHost

    def __init__(
        self, cfg: StressConfig, *, tp_group: Any = None, faults: Faults | None = None
    ) -> None:
        super().__init__(cfg, tp_group=tp_group, faults=faults)
        cache = self.cache
        self.memory = HybridMemory(cache, self.stack.allocator, self.stack.req_pool)
        window = cache.hybrid.sliding_window
        states = cache.components.state_pool
        self.parts = Parts(
            self.pool, self.host_pool, states, cache.host_components.host_states, window
        )
        self.prefetches = Prefetches(cache, self.workload, self.rng, self.counts)

    def _install_faults(self) -> None:
        """Plain faults; loads fail per inner host pool; host state slots come up short."""
        self.faults.flaky_alloc(self.stack.allocator, "device_alloc_none")
        self.faults.flaky_alloc(self.host_pool, "host_alloc_none")
        for inner in self.host_pool.host_pools:
            self.faults.failing_load(inner)
        self.faults.failing_backup(self.host_pool)
        host_states = self.cache.host_components.host_states
        if host_states is not None:
            self.faults.flaky_alloc(host_states, "host_state_alloc_none")
        install_storage_faults(self.faults, self.cache)

    # ---- requests ----------------------------------------------------------------------------

    def admit(self) -> None:
        if self.idle("admit"):
            return
        turn, adopted = self.prefetches.next_turn()
        if turn is None:
            return
        tenant, req = turn.conversation.tenant, StateReq(-1, turn.prompt)
        m = self.cache.match_prefix(RadixKey(turn.prompt, tenant))
        self._expect(checker.namespace(checker.path_to(self.cache, m.last_host_node), tenant))
        if adopted is None and self.prefetches.park(turn, m):
            return
        node = m.last_device_node
        self.cache.inc_lock_ref(node)
        rows = self._alloc_row()
        if rows is None:
            return self._reject(turn, node, "rejected_no_row")
        req.req_pool_idx, req.mamba_branching_seqlen = rows[0], m.mamba_branching_seqlen
        slots = None
        try:
            prefix = m.device_indices
            if m.host_hit_length > 0:
                prefix, node = load_back(self.cache, m, node)
            loaded = len(prefix) > m.device_prefix_len
            self.counts["load_back"] += int(loaded)
            self.counts["storage_served"] += int(loaded and bool(adopted))
            state = self.cache.device_state(node) if loaded else m.state_slot
            self.memory.restore(state, rows[0])
            target = len(turn.prompt) + len(turn.output) - 1
            slots = self._alloc(self._ceil(target - len(prefix)))
            producer = self.cache.ready_to_load_host_cache() if slots is not None else -1
        except STEP_FAULTS:
            return self._give_up(turn, node, rows[0], slots, "rejected_fault")
        if slots is None:
            return self._give_up(turn, node, rows[0], slots, "rejected_no_memory")
        if producer >= 0:
            self.cache.consume_load_batch(producer)
        self._serve(turn, prefix, node, slots, target, req)

    def _serve(
        self, turn: Turn, prefix: torch.Tensor, node: Any, slots: Any, target: int, req: Any
    ) -> None:
        """Check the prefix is usable, start the request and run its first forward."""
        loading, _ = checker.pending(self.cache.cache_controller)
        state = self._row_state(req.req_pool_idx)
        self._expect(
            check_served(self.parts, prefix, turn.prompt, turn.conversation.salt, state, loading)
        )
        new = start_request(self.stack.req_pool, turn, prefix, node, slots, target, req)
        self._compute(new, self.rng.randint(len(prefix), target))
        self.live.append(new)

    def _alloc_row(self) -> list[int] | None:
        if self.memory.states is not None:
            return self.memory.alloc_row()
        return self.stack.req_pool.alloc(1)

    def _row_state(self, row: int) -> int | None:
        states = self.memory.states
        return None if states is None else states.state_slot(row)

    def _row_slots(self, row: int) -> list[int | None]:
        """The device state slots row ``row`` holds: its state, and its track slots."""
        states = self.memory.states
        if states is None:
            return []
        track = range(TRACK_SLOTS) if self.memory.tracking else range(0)
        return [states.state_slot(row), *(states.track_slot(row, i) for i in track)]

    def _give_up(self, turn: Turn, node: Any, row: int, slots: Any, reason: str) -> None:
        if slots is not None:
            self.stack.allocator.free(slots)
        self.stack.req_pool.free(row)
        self._reject(turn, node, reason)

    def _alloc(self, n: int) -> torch.Tensor | None:
        self.memory.swa_room(n)
        return super()._alloc(n)

    def _compute(self, live: Live, end: int) -> None:
        """The forward to ``end``; with decode tracking (pages over one token) first to the
        last page boundary it crosses at or past the prompt's end, whose state the engine,
        decoding token by token, would have tracked (``HybridMemory.track``)."""
        req = live.req
        mark = end - end % self.cfg.page_size
        if self.memory.tracking and req.kv_len < mark and mark >= len(req.origin_input_ids):
            self._forward(live, mark)
            self.memory.track([(req, 0)])
            self.counts["tracked"] += 1
        self._forward(live, end)

    def _forward(self, live: Live, end: int) -> None:
        live.compute(partial(write_kv_hybrid, self.pool), end)
        slot = self._row_state(live.req.req_pool_idx)
        if slot is not None:
            code = state_code(live.req.tokens.ids(end), live.turn.conversation.salt)
            write_state(self.parts.states, slot, code)

    def _completes(self, call: Any, req: Any) -> None:
        self.memory.state_room(finished=call == self.cache.cache_finished_req)
        super()._completes(call, req)

    # ---- hybrid ops and checks -----------------------------------------------------------------

    def idle(self, op: str) -> bool:
        if op == "prefetch_progress":
            return not self.prefetches.waiting
        return super().idle(op)

    def prefetch_progress(self) -> None:
        self.prefetches.progress()

    def drain(self) -> None:
        """Every prefetch aborted, then the plain drain; storage writes landed too."""
        self.prefetches.abort_all()
        super().drain()
        self.cache.drain_transfers()
        self.events()

    def evict_swa(self) -> None:
        self.counts["swa_evicted"] += self.cache.evict_swa(self.rng.randint(1, 2 * self.cfg.unit))

    def evict_states(self) -> None:
        self.counts["states_evicted"] += self.cache.evict_states(self.rng.randint(1, 2))

    def _check_match(self, m: Any, ids: list[int], salt: int, skip: torch.Tensor) -> list[str]:
        return check_served(self.parts, m.device_indices, ids, salt, m.state_slot, skip)

    def check(self) -> None:
        with self.faults.paused():
            self._expect(self.tracker.check(*self._held(), verify=False))
            self._expect(sweep_hybrid(self.cache, self.parts))

    def _sweep(self, requests: list[torch.Tensor]) -> list[str]:
        rows = [s for live in self.live for s in self._row_slots(live.req.req_pool_idx)]
        bad = sweep_hybrid(self.cache, self.parts) + state_ownership(self.cache, self.parts, rows)
        allocator = self.stack.allocator
        if hasattr(allocator, "swa_attn_allocator"):
            bad += swa_ownership(self.cache, allocator, requests)
        try:
            allocator.check_invariants()
        except RuntimeError as err:
            bad.append(f"allocator: {err}")
        return bad
