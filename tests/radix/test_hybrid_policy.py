"""The checkpoint policy: which ``cache_*_req`` calls give a node a copy of the request's state."""

from __future__ import annotations

import pytest

from hicache.radix import RadixKey
from hicache.radix.components import CheckpointPolicy
from tests.radix.hybrid_rig import HybridRig

A = list(range(100, 140))


def state_at(rig: HybridRig, n: int) -> int | None:
    m = rig.cache.match_prefix(RadixKey(A[:n]))
    return m.state_slot if m.device_prefix_len == n else None


@pytest.mark.parametrize("page", [1, 4])
def test_at_finish_checkpoints_a_copy_of_the_request_state(page: int) -> None:
    rig = HybridRig(page_size=page)
    req = rig.schedule(A[:16])
    rig.fill_state(req, 7.0)
    rows_free = rig.state_pool.available_size()
    rig.cache.cache_finished_req(req)
    slot = state_at(rig, 16)
    assert slot is not None and rig.state_value(slot) == 7.0
    assert rig.state_pool.available_size() == rows_free  # the row's slot back, one taken
    rig.check()


def test_an_unaligned_end_or_a_disabled_policy_checkpoints_nothing() -> None:
    rig = HybridRig(page_size=4)
    rig.cache.cache_finished_req(rig.schedule(A[:18]))  # state after 18, pages end at 16
    assert state_at(rig, 16) is None
    off = HybridRig(policy=CheckpointPolicy(at_finish=False))
    off.cache.cache_finished_req(off.schedule(A[:16]))
    assert state_at(off, 16) is None and off.cache.stats().components.states_held == 0


def test_a_second_request_reuses_the_state_and_adds_none_twice() -> None:
    rig = HybridRig()
    rig.cache.cache_finished_req(rig.schedule(A[:16]))
    again = rig.schedule(A[:16])
    assert again.cache_protected_len == 16
    rig.cache.cache_finished_req(again)
    assert rig.cache.stats().components.states_stored == 1
    rig.check()


def test_every_n_tokens_checkpoints_chunk_ends_past_a_multiple() -> None:
    rig = HybridRig(policy=CheckpointPolicy(at_finish=False, every_tokens=8))
    req = rig.schedule(A[:24], kv_len=6)
    rig.cache.cache_unfinished_req(req)  # 6: no multiple of 8 passed
    for end in (8, 12, 16, 24):
        req.kv_len = end
        rig.fill_state(req, float(end))
        rig.cache.cache_unfinished_req(req)
    assert [state_at(rig, n) is not None for n in (6, 8, 12, 16, 24)] == [
        False,
        True,
        False,
        True,
        True,
    ]
    assert rig.state_value(state_at(rig, 16)) == 16.0
    rig.check()
    rig.cache.cache_finished_req(req)
    rig.check()


def test_at_branch_checkpoints_the_chunk_that_ends_at_the_branch() -> None:
    rig = HybridRig(policy=CheckpointPolicy(at_finish=False, at_branch=True))
    rig.put(A[:16], with_state=False)  # a full-KV prefix without a state
    m = rig.cache.match_prefix(RadixKey(A[:24]))
    assert (m.device_prefix_len, m.mamba_branching_seqlen) == (0, 16)
    req = rig.schedule(A[:24], kv_len=16)  # recompute up to the branch first
    req.mamba_branching_seqlen = m.mamba_branching_seqlen
    rig.cache.cache_unfinished_req(req)
    assert state_at(rig, 16) is not None
    rig.check()


def test_every_tokens_must_be_a_page_multiple() -> None:
    with pytest.raises(ValueError, match="every_tokens=6 must be a multiple of page_size=4"):
        HybridRig(page_size=4, policy=CheckpointPolicy(every_tokens=6))


def test_chunk_tokens_end_where_the_policy_takes_a_state() -> None:
    plain = CheckpointPolicy()
    assert plain.chunk_tokens(0, 100, None) == 100
    assert plain.chunk_tokens(10, 100, 40) == 30  # the branch point ahead
    assert plain.chunk_tokens(40, 100, 40) == 100  # passed: no cut
    every = CheckpointPolicy(every_tokens=16)
    assert every.chunk_tokens(0, 100, None) == 16
    assert every.chunk_tokens(20, 100, None) == 12  # to 32
    assert every.chunk_tokens(20, 5, None) == 5  # the limit first
    assert every.chunk_tokens(20, 100, 25) == 5  # the branch point first


def test_chunk_tokens_end_at_the_prompts_last_page_boundary_under_at_finish() -> None:
    assert CheckpointPolicy().chunk_tokens(0, 100, None, finish_at=32) == 32
    assert CheckpointPolicy().chunk_tokens(32, 100, None, finish_at=32) == 100  # passed
    assert CheckpointPolicy(at_finish=False).chunk_tokens(0, 100, None, finish_at=32) == 100
