"""Eviction per component: SWA tombstones outside live windows, states by their own LRU, full
KV as before (taking the node's state with it); and each component's events."""

from __future__ import annotations

from hicache.radix import RadixKey
from hicache.radix.events import BlockRemoved, BlockStored
from tests.radix.hybrid_rig import HybridRig

A, B = list(range(100, 132)), list(range(200, 232))


def test_states_go_by_their_own_lru_and_leave_the_full_kv() -> None:
    rig = HybridRig()
    old, new = rig.put(A[:8]), rig.put(B[:8])
    rig.cache.match_prefix(RadixKey(A[:8]))  # A's state is now the newer
    free = rig.state_pool.available_size()
    assert rig.cache.evict_states(1) == 1
    assert rig.state_pool.available_size() == free + 1 and not rig.state_pool.is_allocated(new)
    m = rig.cache.match_prefix(RadixKey(B[:8]))
    assert (m.device_prefix_len, m.full_kv_hit_length, m.state_evicted) == (0, 8, True)
    assert rig.cache.match_prefix(RadixKey(A[:8])).state_slot == old
    assert rig.cache.total_size() == 16  # full KV untouched
    stats = rig.cache.stats().components
    assert (stats.states_held, stats.states_stored, stats.states_evicted) == (1, 2, 1)
    rig.check()


def test_a_state_the_request_locked_is_not_evicted() -> None:
    rig = HybridRig()
    rig.put(A[:8])
    m = rig.cache.match_prefix(RadixKey(A[:8]))
    rig.cache.inc_lock_ref(m.last_device_node)
    assert rig.cache.evict_states(5) == 0
    rig.cache.dec_lock_ref(m.last_device_node)
    assert rig.cache.evict_states(5) == 1


def test_swa_in_a_live_window_stays_the_rest_is_tombstoned_not_split() -> None:
    rig = HybridRig()  # W = 4
    rig.put(A[:8], with_state=False)
    rig.put(A[:10], with_state=False)
    rig.put(A[:16])
    lock = rig.cache.match_prefix(RadixKey(A[:16])).last_device_node
    rig.cache.inc_lock_ref(lock)  # live window [12, 16); [8, 10) is 6 tokens up: outside
    swa_free = rig.pools.allocator.swa_available_size()
    assert rig.cache.evict_swa(100) == 10
    assert rig.pools.allocator.swa_available_size() == swa_free + 10
    assert len(list(rig.cache.tree.nodes())) == 3  # nothing split
    assert rig.cache.match_prefix(RadixKey(A[:16])).device_prefix_len == 16
    assert rig.cache.stats().components.swa_tombstoned_tokens == 10
    rig.check()
    rig.cache.dec_lock_ref(lock)


def test_full_eviction_frees_the_state_and_the_tombstone_with_the_node() -> None:
    rig = HybridRig()
    rig.put(A[:8])
    rig.cache.evict_swa(8)
    free_states = rig.state_pool.available_size()
    full_free = rig.pools.allocator.full_available_size()
    assert rig.cache.evict(8) == 8
    assert rig.pools.allocator.full_available_size() == full_free + 8
    assert rig.state_pool.available_size() == free_states  # its state went with the tombstone
    stats = rig.cache.stats().components
    assert (stats.states_held, stats.swa_tombstoned_tokens, stats.swa_tombstoned_total) == (0, 0, 8)
    rig.check()


def test_evict_takes_leaves_and_their_states() -> None:
    rig = HybridRig()
    rig.put(A[:8])
    free_states = rig.state_pool.available_size()
    assert rig.cache.evict(100) == 8
    assert rig.state_pool.available_size() == free_states + 1
    assert rig.cache.stats().components.states_evicted == 1
    rig.check()


def test_reset_gives_every_state_back() -> None:
    rig = HybridRig()
    rig.put(A[:8])
    rig.put(B[:8])
    free_states = rig.state_pool.available_size()
    rig.cache.reset()
    assert rig.state_pool.available_size() == free_states + 2
    rig.check()


def test_events_name_their_component() -> None:
    rig = HybridRig(page_size=4)
    rig.cache = type(rig.cache)(
        rig.pools.req_to_token,
        rig.pools.allocator,
        4,
        hybrid=rig.cache.hybrid,
        enable_kv_events=True,
    )
    rig.put(A[:8])
    stored = rig.cache.take_events()
    assert [(type(e), e.component) for e in stored] == [
        (BlockStored, "full"),
        (BlockStored, "full"),
        (BlockStored, "mamba"),
    ]
    assert stored[2].block_hashes == stored[1].block_hashes  # the state after the last page
    rig.cache.evict_swa(8)
    gone = rig.cache.take_events()
    assert [(type(e), e.component) for e in gone] == [
        (BlockRemoved, "swa"),
        (BlockRemoved, "swa"),
        (BlockRemoved, "mamba"),
    ]


def test_a_request_that_recomputed_a_tombstoned_node_revives_it() -> None:
    rig = HybridRig(pattern="FS")
    rig.put(A[:8])
    rig.cache.evict_swa(8)
    req = rig.schedule(A[:8])
    assert req.cache_protected_len == 0  # the window is broken: recomputed
    mine = rig.pools.req_to_token.req_to_token[req.req_pool_idx, :8].clone().long()
    full_free = rig.pools.allocator.full_available_size()
    rig.cache.cache_finished_req(req)
    node = rig.cache.match_prefix(RadixKey(A[:8])).last_device_node
    assert rig.cache.match_prefix(RadixKey(A[:8])).device_prefix_len == 8
    assert node.value.tolist() == mine.tolist()  # the request's live slots, not the dead ones
    assert rig.pools.allocator.full_available_size() == full_free + 8  # the old ones freed
    assert rig.cache.stats().components.swa_tombstoned_tokens == 0
    rig.check()
