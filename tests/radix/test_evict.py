"""Eviction: order per policy, ties, lock protection, allocator frees, incremental leaf set."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

from hicache.radix import EVICTION_POLICIES, RadixCache
from hicache.radix.policies import LeafSet

from .fakes import FakeAllocator


def survivors(cache: RadixCache, keys: list[list[int]]) -> list[int]:
    return [i for i, k in enumerate(keys) if cache.match_prefix(k).device_indices.numel()]


def eviction_order(cache: RadixCache, keys: list[list[int]]) -> list[int]:
    """Evict one leaf at a time (without matching, which would touch the nodes)."""
    present = {tuple(k): i for i, k in enumerate(keys)}
    order = []
    while cache.evictable_size():
        before = set(cache.evictable_leaves())
        cache.evict(1)
        gone = before - set(cache.evictable_leaves())
        order += [present[tuple(n.key.tolist())] for n in gone if n.parent is None]
        cache.check_invariants()
    return order


KEYS = [[1, 1], [2, 2], [3, 3]]


def build(policy: str, priorities=(0, 0, 0)) -> RadixCache:
    """A, B, C created in that order; then A matched twice, then B once."""
    cache = RadixCache(None, None, eviction_policy=policy)
    for k, prio in zip(KEYS, priorities, strict=True):
        cache.insert(k, priority=prio)
    for k in (KEYS[0], KEYS[0], KEYS[1]):
        cache.match_prefix(k)
    return cache


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("lru", [2, 0, 1]),  # C untouched, A last touched before B
        ("mru", [1, 0, 2]),
        ("fifo", [0, 1, 2]),
        ("filo", [2, 1, 0]),
        ("lfu", [2, 1, 0]),  # hits: C 0, B 1, A 2
    ],
)
def test_eviction_order_per_policy(policy, expected):
    assert eviction_order(build(policy), KEYS) == expected


def test_priority_policy_evicts_lowest_priority_first():
    assert eviction_order(build("priority", (2, 0, 1)), KEYS) == [1, 2, 0]


def test_priority_ties_break_by_recency():
    # all priority 1: the least recently used goes first (like lru)
    assert eviction_order(build("priority", (1, 1, 1)), KEYS) == [2, 0, 1]


def test_lfu_ties_break_by_recency():
    cache = RadixCache(None, None, eviction_policy="lfu")
    for k in KEYS:
        cache.insert(k)
    cache.match_prefix(KEYS[0])
    cache.match_prefix(KEYS[2])
    # hits A 1, B 0, C 1; A touched before C
    assert eviction_order(cache, KEYS) == [1, 0, 2]


def test_insert_counts_as_a_hit_for_lfu():
    cache = RadixCache(None, None, eviction_policy="lfu")
    for k in KEYS:
        cache.insert(k)
    cache.insert(KEYS[0])
    cache.insert(KEYS[0])
    cache.insert(KEYS[2])
    assert eviction_order(cache, KEYS) == [1, 2, 0]


def test_parent_becomes_evictable_after_its_leaves():
    cache = RadixCache(None, None)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 5, 6])
    assert len(cache.evictable_leaves()) == 2
    assert cache.evict(2) == 2
    assert cache.evict(2) == 2
    assert len(cache.evictable_leaves()) == 1  # now [1, 2]
    assert cache.evict(100) == 2
    assert cache.total_size() == 0 and not cache.root.children
    cache.check_invariants()


def test_evict_takes_whole_nodes():
    cache = RadixCache(None, None)
    cache.insert(list(range(10)))
    assert cache.evict(1) == 10
    assert cache.evict(0) == 0


def test_locked_nodes_and_ancestors_survive():
    cache = RadixCache(None, None)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 5, 6])
    cache.insert([7, 8])
    locked = cache.match_prefix([1, 2, 3, 4]).last_device_node
    cache.inc_lock_ref(locked)
    assert cache.evict(100) == 4  # [5, 6] and [7, 8]; [1, 2] and [3, 4] are protected
    assert cache.match_prefix([1, 2, 3, 4]).device_indices.tolist() == [1, 2, 3, 4]
    assert cache.total_size() == cache.protected_size() == 4
    cache.dec_lock_ref(locked)
    assert cache.evict(100) == 4
    cache.check_invariants()


def test_unlocked_child_of_locked_node_is_evictable():
    cache = RadixCache(None, None)
    cache.insert([1, 2, 3, 4])
    parent = cache.match_prefix([1, 2]).last_device_node
    cache.inc_lock_ref(parent)
    assert cache.evict(100) == 2
    assert cache.match_prefix([1, 2, 3, 4]).device_indices.tolist() == [1, 2]
    cache.check_invariants()


@pytest.mark.parametrize("page", [1, 4])
def test_evict_frees_through_allocator_in_one_call(page):
    alloc = FakeAllocator(64, page)
    cache = RadixCache(None, alloc, page)
    for first in range(3):
        slots = alloc.alloc(2 * page)
        cache.insert([first] * (2 * page), slots)
    assert alloc.available_size() == 64 - 6 * page
    assert cache.evict(6 * page) == 6 * page
    assert alloc.available_size() == 64 and alloc.freed_calls == 1
    cache.check_invariants()


def test_evict_is_incremental_not_a_rebuild(monkeypatch):
    cache = RadixCache(None, None, 1)
    cache.insert([0, 1, 2])
    cache.insert([0, 1, 3])  # [0, 1] becomes a leaf once both children are gone
    for first in range(1, 2000):
        cache.insert([first, 1, 2])
    adds = []
    original = LeafSet.add
    monkeypatch.setattr(LeafSet, "add", lambda self, n: adds.append(n) or original(self, n))
    monkeypatch.setattr("hicache.radix.invariants.iter_nodes", lambda *_: pytest.fail("walked"))
    assert cache.evict(2) == 2  # the two oldest leaves: [2] and [3] under [0, 1]
    assert [n.key.tolist() for n in adds] == [[0, 1]]  # only the parent is re-filed
    monkeypatch.undo()
    cache.check_invariants()


@pytest.mark.parametrize("policy", sorted(EVICTION_POLICIES))
def test_every_policy_drains_the_tree(policy):
    cache = RadixCache(None, None, 2, eviction_policy=policy)
    for seq in ([1, 2, 3, 4], [1, 2, 5, 6], [9, 9], [1, 2, 3, 4, 7, 7]):
        cache.insert(seq)
        cache.match_prefix(seq[:2])
    assert cache.evict(1000) == 10
    assert cache.total_size() == 0
    cache.check_invariants()


def test_leaf_set_orders_and_discards():
    from hicache.radix.node import TreeNode

    nodes = [TreeNode(torch.zeros(1).numpy(), None, None, tick=t) for t in (5, 1, 3)]
    leaves = LeafSet("lru")
    for node in nodes:
        leaves.add(node)
    assert [n.last_access_time for n in leaves] == [1, 3, 5]
    assert leaves.discard(nodes[2]) and not leaves.discard(nodes[2])
    assert nodes[2] not in leaves and len(leaves) == 2
    assert leaves.pop() is nodes[1]
    nodes[0].last_access_time = 9
    assert leaves.stale(nodes[0])
    leaves.clear()
    assert len(leaves) == 0
    assert leaves.pop() is None


@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["add", "discard", "pop"]), st.integers(0, 9), st.integers(0, 5)),
        max_size=60,
    )
)
def test_leaf_set_matches_a_sorted_model(ops):
    """In-order adds (the O(1) tail) and out-of-order ones (the sorted run) pop as one order."""
    from hicache.radix.node import TreeNode

    nodes = [TreeNode(torch.zeros(1).numpy(), None, None) for _ in range(10)]
    leaves, model = LeafSet("lru"), {}
    for op, i, tick in ops:
        node = nodes[i]
        if op == "add" and node not in leaves:
            node.last_access_time = tick
            leaves.add(node)
            model[node.id] = (tick, node.id)
        elif op == "discard":
            assert leaves.discard(node) == (model.pop(node.id, None) is not None)
        elif op == "pop":
            popped = leaves.pop()
            expected = min(model.values(), default=None)
            assert (popped and (popped.last_access_time, popped.id)) == expected
            model.pop(expected and expected[1], None)
        assert [(n.last_access_time, n.id) for n in leaves] == sorted(model.values())
