"""Hypothesis state machines: slot accounting of MambaPool and HybridReqToTokenPool.

At every step: free + held == capacity, no slot held twice, exhaustion returns None and takes
nothing, requests keep their slots across rows, and misuse changes nothing.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from hicache.pools import HybridReqToTokenPool, MambaPool
from tests.pools.helpers import as_bytes, fill_random
from tests.pools.mamba_helpers import FakeReq, params, slot_ids

SETTINGS = settings(
    max_examples=15,
    stateful_step_count=25,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
)
MAMBA_SIZE = 6
pick = st.integers(0, 99)


def idx(slots: list[int]) -> torch.Tensor:
    return torch.tensor(slots, dtype=torch.int64)


class MambaPoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = MambaPool(size=MAMBA_SIZE, cache_params=params(), device="cpu")
        self.held: set[int] = set()

    def _some(self, k: int, seed: int) -> list[int]:
        ordered = sorted(self.held)
        return [ordered[(seed + i) % len(ordered)] for i in range(min(k, len(ordered)))]

    @rule(n=st.integers(0, 4))
    def alloc(self, n: int) -> None:
        free = self.pool.available_size()
        got = self.pool.alloc(n)
        if n > free:
            assert got is None and self.pool.available_size() == free
            return
        assert got is not None and len(set(got.tolist())) == n
        assert not self.held & set(got.tolist())
        self.held |= set(got.tolist())

    @rule(k=st.integers(1, 3), seed=pick)
    def free(self, k: int, seed: int) -> None:
        slots = self._some(k, seed)
        self.pool.free(idx(slots))
        self.held -= set(slots)

    @rule(k=st.integers(1, 2), seed=pick)
    def fork(self, k: int, seed: int) -> None:
        src = self._some(k, seed)
        fill_random([*self.pool.mamba_cache.conv, self.pool.mamba_cache.temporal], seed=seed)
        free = self.pool.available_size()
        got = self.pool.fork_from(idx(src))
        if len(src) > free:
            assert got is None and self.pool.available_size() == free
            return
        assert got is not None and not self.held & set(got.tolist())
        t = self.pool.mamba_cache.temporal
        assert torch.equal(as_bytes(t[:, got]), as_bytes(t[:, src]))
        self.held |= set(got.tolist())

    @rule(slot=st.integers(-1, MAMBA_SIZE + 1))
    def free_a_slot_not_held(self, slot: int) -> None:
        if slot in self.held:
            return
        free = self.pool.available_size()
        try:
            self.pool.free(idx([slot]))
        except (IndexError, ValueError):
            pass
        else:
            raise AssertionError(f"freeing slot {slot}, not held, was accepted")
        assert self.pool.available_size() == free

    @invariant()
    def accounting(self) -> None:
        assert self.pool.available_size() + len(self.held) == MAMBA_SIZE
        assert all(self.pool.is_allocated(s) for s in self.held)


class HybridMachine(RuleBasedStateMachine):
    """Requests run (a row), park (row freed, slots kept: chunked prefill) or finish; slots a
    caller keeps (``..._to_keep``) are given back to the Mamba pool later."""

    ROWS = 3

    def __init__(self) -> None:
        super().__init__()
        self.pool = HybridReqToTokenPool(
            size=self.ROWS,
            mamba_size=MAMBA_SIZE,
            max_context_len=4,
            device="cpu",
            cache_params=params(),
            enable_mamba_extra_buffer=True,
        )
        self.running: list[FakeReq] = []
        self.parked: list[FakeReq] = []
        self.kept: list[int] = []

    @rule(fresh=st.integers(0, 2), parked=st.integers(0, 2))
    def alloc(self, fresh: int, parked: int) -> None:
        reqs = [FakeReq() for _ in range(fresh)] + self.parked[:parked]
        before = [slot_ids(r) for r in reqs]
        rows, slots = self.pool.available_size(), self.pool.mamba_pool.available_size()
        need = 3 * fresh
        got = self.pool.alloc(len(reqs), reqs)
        if len(reqs) > rows or need > slots:
            assert got is None
            assert (self.pool.available_size(), self.pool.mamba_pool.available_size()) == (
                rows,
                slots,
            )
            assert [slot_ids(r) for r in reqs] == before
            return
        assert got is not None and [r.req_pool_idx for r in reqs] == got
        assert all(slot_ids(r) == b for r, b in zip(reqs[fresh:], before[fresh:], strict=True))
        self.parked = self.parked[len(reqs) - fresh :]
        self.running += reqs

    @rule(
        i=pick,
        how=st.sampled_from(["free", "free_keep", "cache_then_row", "park"]),
        keep=st.integers(0, 1),
    )
    def finish(self, i: int, how: str, keep: int) -> None:
        if not self.running:
            return
        req = self.running.pop(i % len(self.running))
        row = req.req_pool_idx
        if how == "park":
            self.pool.free(row, free_mamba_cache=False)
            self.parked.append(req)
            return
        if how in ("free_keep", "cache_then_row"):
            self.kept.append(slot_ids(req)[1 + keep])
        to_keep = keep if how != "free" else None
        if how == "cache_then_row":
            self.pool.free_mamba_cache(req, mamba_ping_pong_track_buffer_to_keep=to_keep)
            self.pool.free(row, free_mamba_cache=False)
        else:
            self.pool.free(row, mamba_ping_pong_track_buffer_to_keep=to_keep)

    @rule()
    def abort_parked(self) -> None:
        if self.parked:
            self.pool.free_mamba_cache(self.parked.pop())

    @rule()
    def give_back_kept(self) -> None:
        if self.kept:
            self.pool.mamba_pool.free(idx([self.kept.pop()]))

    @rule(i=pick)
    def steal_a_running_requests_state(self, i: int) -> None:
        if not self.running:
            return
        thief = FakeReq(mamba_pool_idx=self.running[i % len(self.running)].mamba_pool_idx)
        rows = self.pool.available_size()
        try:
            self.pool.alloc(1, [thief])
        except ValueError:
            assert self.pool.available_size() == rows and thief.req_pool_idx is None
        else:
            raise AssertionError("a state slot mapped by a live row was handed out again")

    @invariant()
    def accounting(self) -> None:
        held = [s for r in self.running + self.parked for s in slot_ids(r)] + self.kept
        assert len(set(held)) == len(held), f"a slot is held twice: {held}"
        assert self.pool.mamba_pool.available_size() + len(held) == MAMBA_SIZE
        assert self.pool.available_size() + len(self.running) == self.ROWS
        rows = torch.tensor([r.req_pool_idx for r in self.running], dtype=torch.int64)
        states = [slot_ids(r)[0] for r in self.running]
        assert self.pool.get_mamba_indices(rows).tolist() == states


def test_mamba_pool_accounting() -> None:
    run_state_machine_as_test(MambaPoolMachine, settings=SETTINGS)


def test_hybrid_pool_accounting() -> None:
    run_state_machine_as_test(HybridMachine, settings=SETTINGS)
