"""Write policies, the two-tier eviction rules, load-back decisions and transfer locks."""

from __future__ import annotations

import pytest
import torch

from hicache.radix import HiRadixCache, RadixKey
from tests.radix.hiradix_rig import (
    assert_kv,
    device_pool,
    host_accounted,
    load_all,
    make_cache,
    put,
    tokens_of,
)

A, B = tokens_of(8, seed=1), tokens_of(8, seed=2)


def node_of(cache: HiRadixCache, tokens: list[int]):
    return cache.match_prefix(RadixKey(tokens)).last_host_node


def test_write_through_backs_up_on_insert() -> None:
    cache = make_cache(page_size=2)
    put(cache, A)
    node = node_of(cache, A)
    assert node.backuped and cache.host_size() == 8
    assert cache.protected_size() == 0, "the write ack was processed when insert returned"


def test_write_through_selective_backs_up_on_the_second_hit() -> None:
    cache = make_cache(page_size=2, write_policy="write_through_selective")
    put(cache, A)
    node = node_of(cache, A)  # first hit
    assert not node.backuped
    node = node_of(cache, A)  # second hit: queued, locked until the ack
    assert node.backuped and node.lock_ref == 1 and cache.protected_size() == 8
    cache.check_invariants()
    assert cache.evict(8) == 0, "a node being written is never evicted"
    cache.check_hicache_events()
    assert node.lock_ref == 0 and cache.protected_size() == 0
    cache.check_invariants()


def test_write_back_backs_up_only_on_eviction_with_its_ancestors() -> None:
    cache = make_cache(page_size=2, write_policy="write_back")
    put(cache, A)
    put(cache, A + B)
    parent, child = node_of(cache, A), node_of(cache, A + B)
    assert cache.host_size() == 0
    assert cache.evict(2) == 8  # the child leaf, whole
    cache.check_invariants()
    assert child.evicted and child.backuped and parent.backuped and not parent.evicted
    assert cache.protected_size() == 0 and host_accounted(cache)
    assert cache.evict(8) == 8
    assert parent.evicted and cache.total_size() == 0
    assert_kv(device_pool(cache), load_all(cache, A + B), A + B)


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective"])
def test_eviction_deletes_nodes_without_a_host_copy(policy: str, monkeypatch) -> None:
    cache = make_cache(page_size=2, write_policy=policy)
    monkeypatch.setattr(cache.cache_controller.mem_pool_host, "alloc", lambda n: None)
    put(cache, A)  # the host refuses: the backup is skipped, nothing leaks
    assert not node_of(cache, A).backuped and host_accounted(cache)
    assert cache.evict(8) == 8
    cache.check_invariants()
    assert not cache.root.children and cache.host_size() == 0


def test_evict_host_frees_only_host_only_leaves() -> None:
    cache = make_cache(page_size=2)
    put(cache, A)
    put(cache, A[:4] + B[:4])
    assert cache.evict_host(100) == 0, "every host copy still has a device copy"
    cache.evict(4)  # LRU: A's tail leaf
    cache.check_invariants()
    assert cache.evict_host(1) == 4  # a whole node: A's tail
    cache.check_invariants()
    assert cache.host_size() == 8 and host_accounted(cache)
    m = cache.match_prefix(RadixKey(A))
    assert len(m.device_indices) == 4 and m.host_hit_length == 0


def test_evict_host_walks_up_host_only_chains() -> None:
    cache = make_cache(page_size=2)
    put(cache, A)
    put(cache, A + B)
    cache.evict(16)
    assert cache.evict_host(16) == 16
    cache.check_invariants()
    assert not cache.root.children and host_accounted(cache) and cache.host_size() == 0


def test_write_through_evicts_host_leaves_to_make_room() -> None:
    cache = make_cache(page_size=2, pages=8, hicache_ratio=1.5)  # 16 device, 24 host slots
    old, new = tokens_of(16, seed=5), tokens_of(16, seed=6)
    put(cache, old)
    cache.evict(16)
    put(cache, new)  # needs 16 host slots, 8 free: the old host-only node goes
    cache.check_invariants()
    assert node_of(cache, new).backuped and cache.host_size() == 16
    assert cache.match_prefix(RadixKey(old)).host_hit_length == 0
    assert host_accounted(cache)


def test_short_host_hits_are_recomputed() -> None:
    cache = make_cache(page_size=2, load_back_threshold=8)
    put(cache, A[:4])
    put(cache, A)
    cache.evict(4)  # A's tail goes to the host: a 4-token host hit
    m = cache.match_prefix(RadixKey(A))
    assert m.host_hit_length == 4
    loaded, node = cache.init_load_back(m.last_host_node, m.host_hit_length)
    assert len(loaded) == 0 and node is m.last_device_node
    assert cache.cache_controller.load_queue == [] and m.last_host_node.evicted
    cache.check_invariants()


def test_mem_quota_limits_the_load() -> None:
    cache = make_cache(page_size=2)
    put(cache, A)
    cache.evict(8)
    m = cache.match_prefix(RadixKey(A))
    loaded, node = cache.init_load_back(m.last_host_node, 8, mem_quota=6)
    assert len(loaded) == 0 and node is cache.root
    loaded, node = cache.init_load_back(m.last_host_node, 8, mem_quota=8)
    assert len(loaded) == 8 and node is m.last_host_node


def test_load_gives_up_cleanly_when_the_device_is_full_of_locked_nodes() -> None:
    cache = make_cache(page_size=2, pages=8)
    put(cache, A)
    cache.evict(8)
    put(cache, B + A)  # 16 slots: the whole device pool
    cache.inc_lock_ref(node_of(cache, B + A))
    m = cache.match_prefix(RadixKey(A))
    before = (cache.token_to_kv_pool_allocator.available_size(), cache.total_size())
    loaded, node = cache.init_load_back(m.last_host_node, m.host_hit_length)
    assert len(loaded) == 0 and node is cache.root and m.last_host_node.evicted
    assert (cache.token_to_kv_pool_allocator.available_size(), cache.total_size()) == before
    assert m.last_host_node.lock_ref == 0
    cache.check_invariants()


def test_load_evicts_device_memory_to_make_room() -> None:
    cache = make_cache(page_size=2, pages=8)
    put(cache, A)
    cache.evict(8)
    put(cache, B + B)  # fills the device; unlocked, backed up
    loaded, node = cache.init_load_back(node_of(cache, A), 8)
    assert len(loaded) == 8
    cache.ready_to_load_host_cache()
    cache.check_hicache_events()
    cache.check_invariants()
    assert_kv(device_pool(cache), loaded, A)
    assert node_of(cache, B + B).evicted


def test_a_loading_node_stays_locked_until_its_ack() -> None:
    cache = make_cache(page_size=2)
    put(cache, A)
    cache.evict(8)
    m = cache.match_prefix(RadixKey(A))
    loaded, node = cache.init_load_back(m.last_host_node, m.host_hit_length)
    assert node.lock_ref == 1 and cache.protected_size() == 8
    assert cache.evict(8) == 0
    cache.check_invariants()
    cache.check_hicache_events()  # queued, not issued: still locked
    assert node.lock_ref == 1
    assert cache.ready_to_load_host_cache() >= 0
    cache.check_hicache_events()
    assert node.lock_ref == 0 and cache.evictable_size() == 8
    assert cache.ready_to_load_host_cache() == -1


def test_a_second_load_of_the_same_node_loads_nothing() -> None:
    cache = make_cache(page_size=2)
    put(cache, A)
    cache.evict(8)
    m = cache.match_prefix(RadixKey(A))
    first, _ = cache.init_load_back(m.last_host_node, 8)
    again, node = cache.init_load_back(m.last_host_node, 8)
    assert len(first) == 8 and len(again) == 0 and node is m.last_host_node
    cache.check_invariants()


def test_reset_with_transfers_queued_empties_both_tiers() -> None:
    cache = make_cache(page_size=2, write_policy="write_through_selective")
    put(cache, A)
    put(cache, B)
    cache.evict(8)  # A is not backed up yet: deleted; B goes too
    put(cache, A)
    node_of(cache, A)
    node_of(cache, A)  # a write queued
    put(cache, B)
    host_pool = cache.cache_controller.mem_pool_host
    cache.reset()
    cache.check_invariants()
    allocator = cache.token_to_kv_pool_allocator
    assert allocator.available_size() == allocator.size
    assert host_pool.available_size() == host_pool.size
    assert cache.cache_controller.write_queue == [] and cache.total_size() == 0


def test_reset_after_a_queued_load() -> None:
    cache = make_cache(page_size=2)
    put(cache, A)
    cache.evict(8)
    m = cache.match_prefix(RadixKey(A))
    cache.init_load_back(m.last_host_node, 8)
    cache.reset()
    cache.check_invariants()
    assert cache.cache_controller.load_queue == [] and host_accounted(cache)
    allocator = cache.token_to_kv_pool_allocator
    assert allocator.available_size() == allocator.size


def test_insert_over_a_host_only_node_takes_the_new_device_slots() -> None:
    cache = make_cache(page_size=2)
    put(cache, A)
    cache.evict(8)
    slots = put(cache, A + B)  # recomputed A: the tree adopts these slots
    cache.check_invariants()
    m = cache.match_prefix(RadixKey(A + B))
    assert m.host_hit_length == 0 and torch.equal(m.device_indices, slots)
    assert cache.host_size() == 16


def test_a_failed_backup_is_retried_and_never_leaks(monkeypatch) -> None:
    cache = make_cache(page_size=2)
    host_pool = cache.cache_controller.mem_pool_host
    real = host_pool.backup_from_device_all_layer

    def failing(*args):
        raise RuntimeError("injected")

    monkeypatch.setattr(host_pool, "backup_from_device_all_layer", failing)
    with pytest.raises(RuntimeError, match="injected"):
        put(cache, A)
    cache.check_invariants()
    node = node_of(cache, A)
    assert node.lock_ref == 1 and cache.cache_controller.write_queue
    monkeypatch.setattr(host_pool, "backup_from_device_all_layer", real)
    cache.check_hicache_events()
    assert node.lock_ref == 0
    cache.evict(8)
    assert_kv(device_pool(cache), load_all(cache, A), A)


def test_a_failed_load_is_retried(monkeypatch) -> None:
    cache = make_cache(page_size=2)
    put(cache, A)
    cache.evict(8)
    host_pool = cache.cache_controller.mem_pool_host
    real = host_pool.plan_load
    monkeypatch.setattr(
        host_pool,
        "plan_load",
        lambda *a: (_ for _ in ()).throw(RuntimeError("injected")),
    )
    m = cache.match_prefix(RadixKey(A))
    loaded, node = cache.init_load_back(m.last_host_node, 8)
    with pytest.raises(RuntimeError, match="injected"):
        cache.ready_to_load_host_cache()
    cache.check_invariants()
    assert node.lock_ref == 1
    monkeypatch.setattr(host_pool, "plan_load", real)
    assert cache.ready_to_load_host_cache() >= 0
    cache.check_hicache_events()
    assert node.lock_ref == 0
    assert_kv(device_pool(cache), loaded, A)


def test_a_load_back_chain_survives_the_host_evictions_its_room_needs() -> None:
    """write_back: making device room for the load writes the victim back, which needs host
    room; the host-only chain being loaded must not be what evict_host frees."""
    cache = make_cache(page_size=2, pages=8, write_policy="write_back", hicache_ratio=1.5)
    x, y = tokens_of(16, seed=7), tokens_of(16, seed=8)
    put(cache, x)
    cache.evict(16)
    put(cache, y)  # the whole device; its write-back would need 16 host slots, 8 are free
    m = cache.match_prefix(RadixKey(x))
    loaded, node = cache.init_load_back(m.last_host_node, m.host_hit_length)
    cache.check_invariants()
    assert node is m.last_host_node and len(loaded) == 16
    cache.ready_to_load_host_cache()
    cache.check_hicache_events()
    assert_kv(device_pool(cache), loaded, x)
    assert cache.match_prefix(RadixKey(y)).last_host_node is cache.root, "y could not be kept"
    assert host_accounted(cache)
