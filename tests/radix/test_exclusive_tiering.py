"""Exclusive device<->host tiering (``tiering="exclusive"``): a settled node holds one copy; a
device eviction moves only the leaf down; a load-back moves the chain up and frees its host
copies; any host size works; bytes survive down/up/down; events and misuse."""

from __future__ import annotations

import pytest

from hicache.radix import HiCacheConfig, HiRadixCache, RadixKey
from hicache.radix.events import BlockRemoved, BlockStored
from hicache.radix.invariants import iter_nodes
from tests.radix.hiradix_rig import (
    POLICIES,
    assert_kv,
    device_pool,
    host_accounted,
    load_all,
    make_cache,
    put,
    scramble_free,
    tokens_of,
)


def _exclusive(**kwargs):
    kwargs.setdefault("pages", 32)
    return make_cache(tiering="exclusive", **kwargs)


def _both(cache) -> list[int]:
    return [n.id for n in iter_nodes(cache) if n.value is not None and n.host_value is not None]


def _node(cache, tokens: list[int]):
    return cache.match_prefix(RadixKey(tokens)).last_host_node


@pytest.mark.parametrize("policy", POLICIES)
def test_no_settled_node_holds_both_copies_whatever_the_write_policy(policy: str) -> None:
    cache = _exclusive(write_policy=policy)
    a, b = tokens_of(6, 1), tokens_of(6, 2)
    put(cache, a)
    cache.match_prefix(RadixKey(a))
    put(cache, a + b)  # write-through would back both up here; exclusive backs up nothing
    cache.check_hicache_events()
    assert cache.host_size() == 0 and not _both(cache)
    assert cache.stats().host.tiering == "exclusive" and cache.tiering == "exclusive"


def test_eviction_moves_only_the_leaf_down() -> None:
    cache = _exclusive()
    a, b = tokens_of(6, 1), tokens_of(5, 2)
    put(cache, a)
    put(cache, a + b)
    assert cache.evict(5) == 5
    top, leaf = _node(cache, a), _node(cache, a + b)
    assert top.value is not None and top.host_value is None  # the parent stays device-only
    assert leaf.value is None and leaf.host_value is not None  # a host-only node below it
    assert cache.host_size() == 5 and cache.evictable_size() == 6
    cache.check_invariants()


def test_inclusive_write_back_backs_up_the_ancestors_too() -> None:
    cache = make_cache(write_policy="write_back", pages=32)
    a, b = tokens_of(6, 1), tokens_of(5, 2)
    put(cache, a)
    put(cache, a + b)
    cache.evict(5)
    assert _node(cache, a).host_value is not None and cache.host_size() == 11


def test_load_back_moves_the_chain_up_and_frees_its_host_copies() -> None:
    cache = _exclusive()
    a, b = tokens_of(6, 1), tokens_of(5, 2)
    put(cache, a)
    put(cache, a + b)
    cache.evict(11)  # both down: the leaf first, then its parent
    host = cache.cache_controller.mem_pool_host
    assert cache.host_size() == 11 and host.available_size() == host.size - 11
    m = cache.match_prefix(RadixKey(a + b))
    loaded, node = cache.init_load_back(m.last_host_node, m.host_hit_length)
    assert len(loaded) == 11 and cache.host_size() == 11  # the host copies stay while loading
    cache.check_invariants()  # both copies allowed: the load is in flight
    cache.ready_to_load_host_cache()
    cache.check_hicache_events()
    assert cache.host_size() == 0 and host.available_size() == host.size
    assert not _both(cache) and host_accounted(cache)
    assert_kv(device_pool(cache), loaded, a + b)
    cache.check_invariants()


def test_insert_into_a_host_only_node_frees_its_host_copy() -> None:
    cache = _exclusive()
    a = tokens_of(8, 3)
    put(cache, a)
    cache.evict(8)
    assert cache.host_size() == 8
    put(cache, a)  # the caller's slots become the node's device copy
    assert cache.host_size() == 0 and not _both(cache)
    cache.check_invariants()


@pytest.mark.parametrize("ratio", [0.25, 0.5, 1.0])
def test_a_host_smaller_than_the_device_works_and_hits(ratio: float) -> None:
    cache = _exclusive(pages=16, hicache_ratio=ratio)  # 16 device slots, 4-16 host slots
    host_size = cache.cache_controller.mem_pool_host.size
    assert host_size == int(16 * ratio)
    seqs = [tokens_of(4, 10 + i) for i in range(8)]
    for seq in seqs:
        if cache.token_to_kv_pool_allocator.available_size() < 4:
            cache.evict(4)
        put(cache, seq)
    assert cache.host_size() <= host_size
    hits = 0
    for seq in seqs:
        m = cache.match_prefix(RadixKey(seq))
        hits += m.host_hit_length
    assert hits == min(host_size, 16)  # each host page is a hit of one evicted sequence
    assert cache.host_size() + cache.total_size() > 16  # more distinct pages than the device
    cache.check_invariants()


def test_inclusive_host_smaller_than_the_device_is_built() -> None:
    cache = make_cache(pages=16, hicache_ratio=0.5)
    seq = tokens_of(4, 1)
    put(cache, seq)
    cache.check_hicache_events()
    assert cache.host_size() == 4
    cache.check_invariants()


@pytest.mark.parametrize("page_size", [1, 4])
def test_bytes_survive_down_up_down_up(page_size: int) -> None:
    cache = _exclusive(page_size=page_size, pages=8)
    a = tokens_of(4 * page_size, 5)
    b = tokens_of(2 * page_size, 6)
    put(cache, a + b)
    for _ in range(2):
        cache.evict(cache.evictable_size())
        assert cache.total_size() == 0 and cache.host_size() == 6 * page_size
        scramble_free(cache)
        prefix = load_all(cache, a + b)
        assert cache.host_size() == 0 and not _both(cache)
        assert_kv(device_pool(cache), prefix, a + b)


class _PinAll:
    """A storage tier stand-in below the host: every node pinned, nothing read."""

    def pins(self, node) -> bool:
        return True

    def reading(self, slots) -> bool:
        return False

    def backed_up(self, node) -> None:
        pass

    def settle(self) -> None:
        pass

    def victims(self, leaves):
        return iter(leaves.pop, None)


def test_a_device_leaf_that_cannot_move_down_drops_its_host_only_children() -> None:
    cache = _exclusive(pages=16, hicache_ratio=0.25)  # 4 host slots
    a, b = tokens_of(4, 1), tokens_of(4, 2)
    put(cache, a)
    put(cache, a + b)
    cache.evict(4)  # b moves down and fills the host
    assert _node(cache, a + b).host_value is not None
    cache.host_tier.attach(_PinAll())  # b pinned: the host cannot make room for a
    cache.host_tier.refile(_node(cache, a + b))
    assert cache.evict(4) == 4
    assert cache.total_size() == 0 and cache.host_size() == 0 and not list(iter_nodes(cache))
    host = cache.cache_controller.mem_pool_host
    assert host.available_size() == host.size
    cache.check_invariants()


def test_events_a_move_down_stores_host_then_removes_device_a_move_up_removes_host() -> None:
    cache = _exclusive(enable_kv_events=True)
    a = tokens_of(4, 7)
    put(cache, a)
    cache.take_events()
    cache.evict(4)
    down = [(type(e).__name__, e.medium) for e in cache.take_events()]
    assert down == [("BlockStored", "CPU_PINNED")] * 4 + [("BlockRemoved", "GPU")] * 4
    load_all(cache, a)
    up = cache.take_events()
    assert [type(e) for e in up] == [BlockStored] * 4 + [BlockRemoved] * 4
    assert {e.medium for e in up[:4]} == {"GPU"} and {e.medium for e in up[4:]} == {"CPU_PINNED"}


@pytest.mark.parametrize(
    ("tiering", "error"), [("both", ValueError), ("", ValueError), (1, ValueError)]
)
def test_a_wrong_tiering_is_refused_before_anything_is_built(tiering, error) -> None:
    with pytest.raises(error, match="tiering"):
        make_cache(tiering=tiering)


def test_tiering_in_config_and_as_a_keyword_is_refused() -> None:
    allocator = make_cache().token_to_kv_pool_allocator
    config = HiCacheConfig(tiering="exclusive")
    with pytest.raises(ValueError, match="tiering"):
        HiRadixCache(None, allocator, config=config, tiering="exclusive")
    assert HiRadixCache(None, allocator, config=config).tiering == "exclusive"


def test_the_exclusive_check_catches_a_node_holding_both_copies() -> None:
    cache = _exclusive()
    a = tokens_of(4, 9)
    put(cache, a)
    node = _node(cache, a)
    node.host_value = cache.cache_controller.mem_pool_host.alloc(4)  # a corrupted tier
    with pytest.raises(RuntimeError, match="device and a host copy"):
        cache.check_invariants()
