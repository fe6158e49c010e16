"""The hybrid match rule: full KV, the last W tokens' SWA KV, a state at the end."""

from __future__ import annotations

import pytest

from hicache.radix import RadixKey
from tests.radix.hybrid_rig import HybridRig

A = list(range(100, 132))


@pytest.mark.parametrize("page", [1, 4])
def test_a_match_ends_at_a_state_and_names_it(page: int) -> None:
    rig = HybridRig(page_size=page)
    state = rig.put(A[:8])
    rig.put(A[:16], with_state=False)
    m = rig.cache.match_prefix(RadixKey(A[:20]))
    assert (m.device_prefix_len, m.state_slot, m.swa_window_start) == (8, state, 4)
    assert len(m.device_indices) == 8
    assert (m.full_kv_hit_length, m.state_evicted) == (16, True)
    assert len(m.full_kv_node.key) == 8 and m.full_kv_node.parent is m.last_device_node
    rig.check()


def test_a_miss_is_the_root_with_no_state() -> None:
    rig = HybridRig()
    rig.put(A[:8], with_state=False)  # full KV, no state: nothing usable
    m = rig.cache.match_prefix(RadixKey(A[:8]))
    assert (m.device_prefix_len, m.state_slot, m.last_device_node) == (0, None, rig.cache.root)
    assert m.full_kv_hit_length == 8


def test_a_tombstone_in_the_window_moves_the_match_back() -> None:
    rig = HybridRig()  # W = 4
    rig.put(A[:8])
    deep = rig.put(A[:16])
    assert rig.cache.evict_swa(1) == 8  # the LRU node [0, 8): its state's window broke
    rig.check()
    assert rig.cache.stats().components.states_held == 1
    m = rig.cache.match_prefix(RadixKey(A[:16]))
    assert (m.device_prefix_len, m.state_slot) == (16, deep)  # window [12, 16) is intact
    short = rig.cache.match_prefix(RadixKey(A[:8]))
    assert (short.device_prefix_len, short.full_kv_hit_length) == (0, 8)


def test_a_window_reaching_a_tombstone_is_not_usable() -> None:
    rig = HybridRig(window=12)
    rig.put(A[:8], with_state=False)
    rig.put(A[:16])
    rig.cache.evict_swa(1)  # tombstones [0, 8), inside the window [4, 16) of the state at 16
    rig.check()
    m = rig.cache.match_prefix(RadixKey(A[:16]))
    assert (m.device_prefix_len, m.full_kv_hit_length) == (0, 16)
    assert rig.cache.stats().components.states_held == 0


def test_without_linear_layers_any_node_end_with_its_window_matches() -> None:
    rig = HybridRig(pattern="FS")
    rig.put(A[:8])
    rig.put(A[:16])
    m = rig.cache.match_prefix(RadixKey(A[:14]))
    assert (m.device_prefix_len, m.state_slot, m.swa_window_start) == (14, None, 10)
    rig.cache.evict_swa(100)  # nothing is locked: every node tombstoned
    assert rig.cache.match_prefix(RadixKey(A[:14])).device_prefix_len == 0
    rig.check()


def test_without_sliding_window_only_the_state_matters() -> None:
    rig = HybridRig(pattern="FL")
    state = rig.put(A[:8])
    m = rig.cache.match_prefix(RadixKey(A[:12]))
    assert (m.device_prefix_len, m.state_slot, m.swa_window_start) == (8, state, 0)
    assert rig.cache.evict_swa(8) == 0


def test_at_branch_reports_the_branching_seqlen() -> None:
    from hicache.radix.components import CheckpointPolicy

    rig = HybridRig(policy=CheckpointPolicy(at_branch=True))
    rig.put(A[:8])
    rig.put(A[:16], with_state=False)
    m = rig.cache.match_prefix(RadixKey(A[:20]))
    assert m.mamba_branching_seqlen == 16
    assert HybridRig().cache.match_prefix(RadixKey(A[:4])).mamba_branching_seqlen is None
