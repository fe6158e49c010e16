"""Misuse: token ids that would be converted silently, and ``extra_key`` namespaces that would
collide or break the invariants. Each raises a TypeError/ValueError naming the argument before
the tree changes, and the cache keeps working."""

from __future__ import annotations

import enum

import numpy as np
import pytest
import torch

from hicache.pools import ReqToTokenPool, TokenToKVPoolAllocator
from hicache.radix import RadixCache, RadixKey, Req
from hicache.radix.invariants import format_tree
from hicache.radix.key import check_extra_key

BAD_IDS = [
    ([1, True, 3], TypeError),
    ([0, False, 2], TypeError),
    ([np.True_, 2], TypeError),
    (np.array([1, True, 3], dtype=object), TypeError),
    (np.array([1, 2, 3], dtype=object), TypeError),
    (np.zeros((0, 3), np.int64), ValueError),
    (torch.zeros((0, 3), dtype=torch.int64), ValueError),
    ("123", TypeError),
    (["1", "2"], TypeError),
    ([1.0, 2.0], TypeError),
    ([1, 2.0], TypeError),
    (np.array([1.0, 2.0]), TypeError),
    ([[1, 2], [3, 4]], TypeError),
    ([[1], [2, 3]], TypeError),
    (bytearray(b"\x01\x02"), TypeError),
    (memoryview(b"\x01\x02"), TypeError),
    ([2**40], ValueError),
    ([2**70], ValueError),
]


class Lora(enum.IntEnum):
    A = 1


BAD_NAMESPACES = [
    True,
    False,
    1.0,
    float("nan"),
    float("inf"),
    np.int64(1),
    Lora.A,
    [1],
    {"a": 1},
    {1},
    (1, 2.0),
    ("a", (True,)),
    ("a", [1]),
    object(),
]
GOOD_NAMESPACES = [None, 1, "1", b"1", (1,), ((1,),), ("1",), 0, "", ()]


@pytest.fixture
def parts():
    allocator = TokenToKVPoolAllocator(64, 1, "cpu")
    pool = ReqToTokenPool(4, 16, "cpu")
    return RadixCache(pool, allocator, 1), allocator, pool


def snapshot(cache: RadixCache, allocator, pool) -> tuple:
    cache.check_invariants()
    return (
        format_tree(cache),
        cache.total_size(),
        cache.evictable_size(),
        allocator.available_size(),
        pool.available_size(),
    )


def put(cache: RadixCache, allocator, ids: list[int], extra_key=None) -> list[int]:
    slots = allocator.alloc(len(ids))
    cache.insert(RadixKey(ids, extra_key), slots)
    return slots.tolist()


@pytest.mark.parametrize("ids, error", BAD_IDS, ids=lambda v: repr(v)[:30])
def test_bad_token_ids_raise_before_any_change(parts, ids, error) -> None:
    cache, allocator, pool = parts
    put(cache, allocator, [1, 2, 3])
    before = snapshot(cache, allocator, pool)
    with pytest.raises(error, match="token_ids"):
        RadixKey(ids)
    with pytest.raises(error, match="token_ids"):
        cache.match_prefix(ids)
    with pytest.raises(error, match="token_ids"):
        cache.insert(ids, torch.arange(1, 4))
    assert snapshot(cache, allocator, pool) == before
    assert cache.match_prefix([1, 2, 3]).device_indices.numel() == 3


def test_bool_check_keeps_zero_and_one_ids() -> None:
    assert RadixKey([1, 0, 1, 5, 0]).token_ids.tolist() == [1, 0, 1, 5, 0]
    assert RadixKey((0, np.int64(1), torch.tensor(2))).token_ids.tolist() == [0, 1, 2]
    assert RadixKey(range(3)).token_ids.tolist() == [0, 1, 2]
    assert len(RadixKey(np.zeros(0, np.int64))) == 0


@pytest.mark.parametrize("extra_key", BAD_NAMESPACES, ids=repr)
def test_bad_namespace_raises_before_any_change(parts, extra_key) -> None:
    cache, allocator, pool = parts
    put(cache, allocator, [1, 2, 3], 1)
    before = snapshot(cache, allocator, pool)
    with pytest.raises(TypeError, match="extra_key"):
        check_extra_key(extra_key)
    with pytest.raises(TypeError, match="extra_key"):
        RadixKey([1, 2, 3], extra_key)
    assert snapshot(cache, allocator, pool) == before
    assert cache.match_prefix(RadixKey([1, 2, 3], 1)).device_indices.numel() == 3


def test_namespaces_that_python_equates_stay_apart(parts) -> None:
    cache, allocator, _ = parts
    own = {repr(ns): put(cache, allocator, [7, 8], ns) for ns in GOOD_NAMESPACES}
    cache.check_invariants()
    assert cache.total_size() == 2 * len(GOOD_NAMESPACES)
    for ns in GOOD_NAMESPACES:
        assert cache.match_prefix(RadixKey([7, 8], ns)).device_indices.tolist() == own[repr(ns)]


def test_equal_namespaces_built_apart_share_nodes(parts) -> None:
    cache, allocator, _ = parts
    big = 2**100
    slots = put(cache, allocator, [4, 5], ("lora", big, "".join(["te", "nant"])))
    again = ("lora", int(str(big)), "tenant")
    assert cache.match_prefix(RadixKey([4, 5], again)).device_indices.tolist() == slots
    assert cache.insert(RadixKey([4, 5], again), allocator.alloc(2)) == 2


def test_req_with_bad_namespace_is_refused_before_any_change(parts) -> None:
    cache, allocator, pool = parts
    row = pool.alloc(1)[0]
    slots = allocator.alloc(4)
    pool.write((row, slice(0, 4)), slots.to(torch.int32))
    req = Req(row, [1, 2, 3, 4, 5], kv_len=4, extra_key=float("nan"))
    before = snapshot(cache, allocator, pool)
    for call in (cache.cache_finished_req, cache.cache_unfinished_req):
        with pytest.raises(TypeError, match="extra_key"):
            call(req)
        assert snapshot(cache, allocator, pool) == before
    req.extra_key = "tenant"
    cache.cache_finished_req(req)
    cache.check_invariants()
    assert cache.match_prefix(RadixKey([1, 2, 3, 4], "tenant")).device_indices.tolist() == (
        slots.tolist()
    )
