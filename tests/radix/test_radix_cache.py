"""Unit tests of RadixCache: match, insert, split, pages, namespaces, sizes, reset, printing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.radix import MatchResult, RadixCache, RadixKey

from .fakes import FakeAllocator, tree_prefixes


def pure(page_size: int = 1, **kw) -> RadixCache:
    return RadixCache(None, None, page_size, **kw)


def chain_lengths(cache: RadixCache, node) -> list[int]:
    lengths = []
    while node is not cache.root:
        lengths.append(len(node.key))
        node = node.parent
    return lengths[::-1]


def test_empty_tree_misses():
    cache = pure()
    result = cache.match_prefix([1, 2, 3])
    assert isinstance(result, MatchResult)
    assert result.device_indices.dtype == torch.int64 and result.device_indices.numel() == 0
    assert result.last_device_node is cache.root is result.last_host_node
    assert result.host_hit_length == 0
    assert cache.total_size() == 0
    cache.check_invariants()


def test_pure_index_values_are_token_ids():
    cache = pure()
    assert cache.insert([5, 6, 7]) == 0
    result = cache.match_prefix([5, 6, 7, 8])
    assert result.device_indices.tolist() == [5, 6, 7]
    assert result.last_host_node is result.last_device_node
    assert cache.total_size() == cache.evictable_size() == 3


def test_insert_returns_prefix_already_present_and_never_overwrites():
    cache = pure()
    assert cache.insert([1, 2, 3], torch.tensor([10, 20, 30])) == 0
    assert cache.insert([1, 2, 3, 4], torch.tensor([11, 21, 31, 41])) == 3
    assert cache.match_prefix([1, 2, 3, 4]).device_indices.tolist() == [10, 20, 30, 41]
    assert cache.insert([1, 2], torch.tensor([0, 0])) == 2
    assert cache.match_prefix([1, 2, 3, 4]).device_indices.tolist() == [10, 20, 30, 41]
    cache.check_invariants()


def test_match_returns_fresh_tensor():
    cache = pure()
    cache.insert([1, 2, 3])
    out = cache.match_prefix([1, 2, 3]).device_indices
    out[:] = -1
    assert cache.match_prefix([1, 2, 3]).device_indices.tolist() == [1, 2, 3]


def test_match_ending_inside_a_node_splits_it():
    cache = pure()
    cache.insert([1, 2, 3, 4, 5])
    result = cache.match_prefix([1, 2, 3, 9])
    assert result.device_indices.tolist() == [1, 2, 3]
    assert chain_lengths(cache, result.last_device_node) == [3]
    assert [len(c.key) for c in result.last_device_node.children.values()] == [2]
    assert cache.match_prefix([1, 2]).device_indices.tolist() == [1, 2]
    assert chain_lengths(cache, cache.match_prefix([1, 2, 3, 4, 5]).last_device_node) == [2, 1, 2]
    assert cache.total_size() == 5
    cache.check_invariants()


def test_split_copies_stats_and_lock():
    cache = pure()
    cache.insert([1, 2, 3, 4])
    leaf = cache.match_prefix([1, 2, 3, 4]).last_device_node
    cache.inc_lock_ref(leaf)
    upper = cache.match_prefix([1, 2]).last_device_node
    assert upper.lock_ref == 1 and leaf.lock_ref == 1 and leaf.parent is upper
    assert upper.creation_time == leaf.creation_time
    assert cache.protected_size() == 4
    cache.dec_lock_ref(leaf)
    assert cache.evictable_size() == 4 and cache.protected_size() == 0
    cache.check_invariants()


def test_diverging_insert_branches():
    cache = pure()
    cache.insert([1, 2, 3, 4])
    assert cache.insert([1, 2, 7, 8]) == 2
    assert len(cache.root.children) == 1
    branch = next(iter(cache.root.children.values()))
    assert branch.key.tolist() == [1, 2] and len(branch.children) == 2
    assert tree_prefixes(cache).keys() == {
        (None, 1),
        (None, 1, 2),
        (None, 1, 2, 3),
        (None, 1, 2, 3, 4),
        (None, 1, 2, 7),
        (None, 1, 2, 7, 8),
    }
    cache.check_invariants()


@pytest.mark.parametrize("page", [2, 4])
def test_keys_are_truncated_to_whole_pages(page):
    cache = pure(page)
    ids = list(range(1, 2 * page + 2))  # two pages and one token
    assert cache.insert(ids) == 0
    assert cache.total_size() == 2 * page
    assert cache.match_prefix(ids).device_indices.tolist() == ids[: 2 * page]
    assert cache.match_prefix(ids[: page + 1]).device_indices.tolist() == ids[:page]
    assert cache.match_prefix(ids[: page - 1]).device_indices.numel() == 0
    cache.check_invariants()


def test_paged_match_stops_at_first_differing_page():
    cache = pure(2)
    cache.insert([1, 2, 3, 4, 5, 6])
    assert cache.match_prefix([1, 2, 3, 9, 5, 6]).device_indices.tolist() == [1, 2]
    assert cache.insert([1, 2, 3, 9]) == 2  # the page [3, 9] differs from [3, 4]
    node = cache.match_prefix([1, 2]).last_device_node
    assert sorted(c.key.tolist()[0] for c in node.children.values()) == [3, 3]
    cache.check_invariants()


def test_namespaces_never_share_nodes():
    cache = pure()
    cache.insert(RadixKey([1, 2, 3], "a"))
    cache.insert(RadixKey([1, 2, 3], "b"))
    cache.insert([1, 2, 3])
    assert len(cache.root.children) == 3
    assert cache.total_size() == 9
    assert cache.match_prefix(RadixKey([1, 2, 3], "c")).device_indices.numel() == 0
    hit_a = cache.match_prefix(RadixKey([1, 2], "a")).last_device_node
    hit_b = cache.match_prefix(RadixKey([1, 2], "b")).last_device_node
    assert hit_a is not hit_b and hit_a.extra_key == "a" and hit_b.extra_key == "b"
    cache.check_invariants()


def test_namespace_isolation_under_eviction_and_locks():
    cache = pure()
    cache.insert(RadixKey([1, 2], "a"))
    cache.insert(RadixKey([1, 2], "b"))
    cache.inc_lock_ref(cache.match_prefix(RadixKey([1, 2], "a")).last_device_node)
    assert cache.evict(10) == 2
    assert cache.match_prefix(RadixKey([1, 2], "a")).device_indices.tolist() == [1, 2]
    assert cache.match_prefix(RadixKey([1, 2], "b")).device_indices.numel() == 0


def test_hits_and_access_times_update_on_match_and_insert():
    cache = pure()
    cache.insert([1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).last_device_node
    assert node.hit_count == 1
    t = node.last_access_time
    cache.insert([1, 2, 3])
    assert node.hit_count == 2 and node.last_access_time > t
    assert node.creation_time < node.last_access_time


def test_priority_rises_along_insert_path():
    cache = pure()
    cache.insert([1, 2], priority=1)
    cache.insert([1, 2, 3, 4], priority=5)
    path = cache.match_prefix([1, 2, 3, 4]).last_device_node
    assert path.priority == 5 and path.parent.priority == 5
    cache.insert([1, 2], priority=2)
    assert path.parent.priority == 5


def test_long_key_over_many_nodes():
    cache = pure(4)
    ids = np.random.default_rng(0).integers(0, 50_000, 8192)
    for end in range(512, 8193, 512):
        cache.insert(ids[:end])
    result = cache.match_prefix(ids)
    assert result.device_indices.tolist() == ids.tolist()
    assert len(chain_lengths(cache, result.last_device_node)) == 16
    cache.check_invariants()


def test_sizes_and_locks():
    cache = pure()
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 5])
    leaf = cache.match_prefix([1, 2, 3, 4]).last_device_node
    assert cache.inc_lock_ref(leaf) == 4
    assert (cache.evictable_size(), cache.protected_size(), cache.total_size()) == (1, 4, 5)
    assert cache.inc_lock_ref(leaf) == 0
    assert cache.dec_lock_ref(leaf) == 0
    assert cache.dec_lock_ref(leaf) == 4
    assert (cache.evictable_size(), cache.protected_size()) == (5, 0)
    cache.check_invariants()


def test_root_lock_is_a_noop():
    cache = pure()
    assert cache.inc_lock_ref(cache.root) == 0
    assert cache.dec_lock_ref(cache.root) == 0
    assert cache.dec_lock_ref(cache.root) == 0
    cache.check_invariants()


def test_reset_frees_slots_and_empties_tree():
    alloc = FakeAllocator(16)
    cache = RadixCache(None, alloc)
    slots = alloc.alloc(4)
    cache.insert([1, 2, 3, 4], slots)
    cache.reset()
    assert cache.total_size() == 0 and not cache.root.children
    assert alloc.available_size() == 16
    cache.check_invariants()


def test_reset_refuses_while_locked():
    cache = pure()
    cache.insert([1, 2])
    cache.inc_lock_ref(cache.match_prefix([1, 2]).last_device_node)
    with pytest.raises(ValueError, match="locked"):
        cache.reset()
    assert cache.total_size() == 2


def test_disabled_cache_stores_nothing():
    cache = pure(disable=True)
    assert cache.insert([1, 2, 3]) == 0
    assert cache.match_prefix([1, 2, 3]).device_indices.numel() == 0
    assert cache.total_size() == 0 and cache.evict(5) == 0
    cache.check_invariants()


def test_pretty_print_draws_every_node(capsys):
    cache = pure()
    cache.insert([1, 2, 3])
    cache.insert([1, 2, 4])
    cache.insert(RadixKey([9], "ns"))
    cache.pretty_print()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("root evictable=5")
    assert len(out) == 5
    assert out[1].startswith("  #") and out[2].startswith("    #")


def test_accepts_torch_and_numpy_keys():
    cache = pure()
    cache.insert(torch.tensor([1, 2, 3]))
    assert cache.match_prefix(np.array([1, 2, 3])).device_indices.tolist() == [1, 2, 3]


def test_allocator_page_size_must_match():
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(None, FakeAllocator(16, 4), page_size=2)


def _corruptions():
    def sizes(cache):
        cache.ledger.evictable_tokens += 1

    def lock(cache):
        next(iter(cache.root.children.values())).lock_ref = -1

    def leaf_set(cache):
        cache.ledger.leaves.clear()

    def stale(cache):
        leaf = cache.evictable_leaves()[0]
        leaf.last_access_time += 100

    def key_page(cache):
        leaf = cache.evictable_leaves()[0]
        leaf.key = leaf.key[:-1]

    def value_len(cache):
        leaf = cache.evictable_leaves()[0]
        leaf.value = leaf.value[:-1]

    def parent_link(cache):
        leaf = cache.evictable_leaves()[0]
        leaf.parent = cache.root

    def namespace(cache):
        leaf = cache.evictable_leaves()[0]
        leaf.extra_key = "other"

    def double_slot(cache):
        a, b = cache.evictable_leaves()[:2]
        b.value = a.value.clone()

    def free_slot(cache):
        leaf = cache.evictable_leaves()[0]
        cache.token_to_kv_pool_allocator.free(leaf.value)

    return [
        sizes,
        lock,
        leaf_set,
        stale,
        key_page,
        value_len,
        parent_link,
        namespace,
        double_slot,
        free_slot,
    ]


@pytest.mark.parametrize("corrupt", _corruptions(), ids=lambda f: f.__name__)
def test_check_invariants_detects_corruption(corrupt):
    alloc = FakeAllocator(64, 2)
    cache = RadixCache(None, alloc, 2)
    for ids in ([1, 2, 3, 4], [1, 2, 5, 6], [7, 8, 9, 9]):
        cache.insert(ids, alloc.alloc(4))
    cache.check_invariants()
    corrupt(cache)
    with pytest.raises(RuntimeError, match="invariant"):
        cache.check_invariants()


def test_root_node_is_the_root_under_sglangs_name() -> None:
    cache = RadixCache(None, None)
    assert cache.root_node is cache.root
    cache.insert([1, 2, 3])
    assert cache.match_prefix([1, 2]).last_device_node.parent is cache.root_node
