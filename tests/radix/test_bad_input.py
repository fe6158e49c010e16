"""Bad public input: a clear TypeError/ValueError and an unchanged tree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.radix import RadixCache, RadixKey, TreeNode
from hicache.radix.config import RadixCacheConfig

from .fakes import snapshot


@pytest.fixture
def cache() -> RadixCache:
    cache = RadixCache(None, None, 2)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 5, 6])
    cache.inc_lock_ref(cache.match_prefix([1, 2, 3, 4]).last_device_node)
    return cache


BAD_KEYS = [
    ([1.0, 2.0], TypeError),
    ([1, -2], ValueError),
    (["a", "b"], TypeError),
    ("ab", TypeError),
    ([True, False], TypeError),
    (np.array([[1, 2]]), ValueError),
    (torch.tensor([0.5]), TypeError),
    ([2**40], ValueError),
    (None, TypeError),
]


@pytest.mark.parametrize(("bad", "error"), BAD_KEYS)
def test_bad_keys_leave_tree_unchanged(cache, bad, error):
    before = snapshot(cache)
    with pytest.raises(error, match="token_ids"):
        cache.insert(bad)
    with pytest.raises(error, match="token_ids"):
        cache.match_prefix(bad)
    assert snapshot(cache) == before


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (torch.tensor([1, 2, 3]), ValueError),  # one slot short
        (torch.tensor([1, 2, 3, 4, 5]), ValueError),
        (torch.tensor([[1, 2], [3, 4]]), ValueError),
        (torch.tensor([1.0, 2.0, 3.0, 4.0]), TypeError),
        (torch.tensor([True, False, True, False]), TypeError),
        ([1, 2, 3, 4], TypeError),
    ],
)
def test_bad_values_leave_tree_unchanged(cache, value, error):
    before = snapshot(cache)
    with pytest.raises(error, match="value"):
        cache.insert([1, 2, 7, 8], value)
    assert snapshot(cache) == before


def test_bad_priority_and_evict_count(cache):
    before = snapshot(cache)
    with pytest.raises(TypeError, match="priority"):
        cache.insert([9, 9], priority=1.5)
    with pytest.raises(ValueError, match="num_tokens"):
        cache.evict(-1)
    with pytest.raises(TypeError, match="num_tokens"):
        cache.evict(2.0)
    assert snapshot(cache) == before


def test_unlocking_an_unlocked_node(cache):
    unlocked = cache.match_prefix([1, 2, 5, 6]).last_device_node
    before = snapshot(cache)
    with pytest.raises(ValueError, match="not locked"):
        cache.dec_lock_ref(unlocked)
    assert snapshot(cache) == before
    cache.check_invariants()


def test_locking_a_node_from_elsewhere(cache):
    other = RadixCache(None, None, 2)
    other.insert([1, 2])
    foreign = other.match_prefix([1, 2]).last_device_node
    detached = TreeNode(np.array([1, 2], np.int32), torch.tensor([1, 2]), None)
    before = snapshot(cache)
    for node in (foreign, detached):
        with pytest.raises(ValueError, match="not in this tree"):
            cache.inc_lock_ref(node)
        with pytest.raises(ValueError, match="not in this tree"):
            cache.dec_lock_ref(node)
    with pytest.raises(TypeError, match="TreeNode"):
        cache.inc_lock_ref("node")
    assert snapshot(cache) == before


def test_evicted_node_cannot_be_locked():
    cache = RadixCache(None, None)
    cache.insert([1, 2])
    node = cache.match_prefix([1, 2]).last_device_node
    cache.evict(2)
    with pytest.raises(ValueError, match="not in this tree"):
        cache.inc_lock_ref(node)


@pytest.mark.parametrize(
    ("page_size", "error"), [(0, ValueError), (-1, ValueError), (1.0, TypeError), (True, TypeError)]
)
def test_bad_page_size(page_size, error):
    with pytest.raises(error, match="page_size"):
        RadixCache(None, None, page_size)


@pytest.mark.parametrize("policy", ["LRU", "random", "", None, 3])
def test_unknown_eviction_policy(policy):
    with pytest.raises(ValueError, match="eviction_policy"):
        RadixCache(None, None, eviction_policy=policy)


def test_bad_disable_flag_and_config_is_frozen():
    with pytest.raises(TypeError, match="disable"):
        RadixCache(None, None, disable=1)
    config = RadixCacheConfig()
    with pytest.raises(AttributeError):
        config.page_size = 2  # type: ignore[misc]


def test_req_pool_without_allocator():
    with pytest.raises(ValueError, match="allocator"):
        RadixCache(object(), None)


def test_bad_extra_key(cache):
    before = snapshot(cache)
    with pytest.raises(TypeError, match="extra_key"):
        cache.insert(RadixKey([1, 2], extra_key={"a": 1}))
    assert snapshot(cache) == before
