"""MatchResult's slot indices, joined on first read: the values an eager join gave, joined once,
and unchanged by whatever the tree does between the match and the read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hicache.radix.slots as slots_module
from hicache.engine.memory import SlotBudget
from hicache.radix import MatchResult, RadixCache, RadixKey
from hicache.radix.slots import SlotsToJoin
from hicache.stack import build_kv_stack

from .fakes import FakeAllocator
from .hiradix_rig import make_cache, put, tokens_of


@pytest.fixture
def joins(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the joins of matched slots (each ``SlotsToJoin.join``, by its ``concat_slots``)."""
    calls: list[int] = []
    concat = slots_module.concat_slots

    def counting(values, device):
        calls.append(len(values))
        return concat(values, device)

    monkeypatch.setattr(slots_module, "concat_slots", counting)
    return calls


def path_slots(cache: RadixCache, node) -> list[int]:
    """The slots on the path root -> ``node``, read off the nodes now (the eager join)."""
    parts = []
    while node is not cache.root:
        parts.append(node.value.tolist())
        node = node.parent
    return [s for part in reversed(parts) for s in part]


def allocator_cache(page_size: int = 1, size: int = 64) -> tuple[RadixCache, FakeAllocator]:
    allocator = FakeAllocator(size, page_size)
    return RadixCache(None, allocator, page_size), allocator


def insert(cache: RadixCache, allocator: FakeAllocator, ids: list[int]) -> None:
    slots = allocator.alloc(len(ids))
    assert slots is not None
    present = cache.insert(ids, slots)
    if present:
        allocator.free(slots[:present])


def test_match_joins_nothing_and_the_first_read_joins_once(joins):
    cache, allocator = allocator_cache()
    for end in (4, 8, 12):  # a chain of three nodes
        insert(cache, allocator, list(range(end)))
    m = cache.match_prefix(list(range(12)))
    assert joins == [] and m.device_prefix_len == 12
    first = m.device_indices
    assert joins == [3]  # one join of the three nodes' slots
    assert m.device_indices is first and joins == [3]  # kept: the same tensor, no second join
    assert first.tolist() == path_slots(cache, m.last_device_node)
    assert first.dtype == torch.int64 and len(first) == m.device_prefix_len


@pytest.mark.parametrize("page_size", [1, 4])
def test_lazy_values_equal_the_eager_join_on_random_trees(page_size):
    rng = np.random.default_rng(page_size)
    cache, allocator = allocator_cache(page_size, size=4096)
    stems = [rng.integers(0, 50, 8 * page_size).tolist() for _ in range(4)]
    for _ in range(40):
        ids = stems[rng.integers(4)][: rng.integers(1, 9) * page_size]
        insert(cache, allocator, ids + rng.integers(0, 50, 2 * page_size).tolist())
        query = stems[rng.integers(4)] + [99] * rng.integers(0, 3)
        m = cache.match_prefix(query)
        eager = path_slots(cache, m.last_device_node)  # read right after the match
        assert m.device_prefix_len == len(eager)
        assert m.device_indices.tolist() == eager
    cache.check_invariants()


def test_a_split_after_the_match_leaves_the_read_unchanged():
    cache, allocator = allocator_cache()
    insert(cache, allocator, list(range(16)))
    m = cache.match_prefix(list(range(16)))
    want = path_slots(cache, m.last_device_node)
    cache.match_prefix([0, 1, 2, 3, 99])  # splits the matched node at 4
    insert(cache, allocator, list(range(8)) + [77, 78])  # splits it again at 8, adds a leaf
    assert len(m.last_device_node.value) == 8  # the matched node kept only its lower part
    assert m.device_indices.tolist() == want
    cache.check_invariants()


def test_eviction_and_slot_reuse_after_the_match_leave_the_read_unchanged():
    cache, allocator = allocator_cache(size=16)
    insert(cache, allocator, list(range(8)))
    m = cache.match_prefix(list(range(8)))  # not locked: eviction may take it
    want = path_slots(cache, m.last_device_node)
    assert cache.evict(8) == 8 and cache.total_size() == 0
    insert(cache, allocator, list(range(100, 116)))  # takes every slot, the freed ones too
    assert m.device_indices.tolist() == want  # what the match saw (stale: it was not locked)
    assert cache.match_prefix(list(range(8))).device_prefix_len == 0


def test_a_reset_after_the_match_leaves_the_read_unchanged():
    cache, allocator = allocator_cache()
    insert(cache, allocator, list(range(6)))
    m = cache.match_prefix(list(range(6)))
    want = path_slots(cache, m.last_device_node)
    cache.reset()
    assert m.device_indices.tolist() == want


def test_a_load_back_after_the_match_leaves_the_read_unchanged():
    cache = make_cache(pages=8, write_policy="write_through")
    a = tokens_of(4, seed=3)
    put(cache, a)
    cache.check_hicache_events()  # the backup lands: the node now has a host copy
    m_device = cache.match_prefix(RadixKey(a))
    before = m_device.device_indices.clone()  # the reference: read at once
    lazy = cache.match_prefix(RadixKey(a))
    cache.evict(cache.total_size())  # device copy dropped, host copy kept
    allocator = cache.token_to_kv_pool_allocator
    every = allocator.alloc(allocator.available_size())
    held = every[torch.isin(every, before)]  # a's former slots: the load-back gets others
    allocator.free(every[~torch.isin(every, before)])
    m_host = cache.match_prefix(RadixKey(a))
    assert m_host.device_prefix_len == 0 and m_host.host_hit_length == 4
    loaded, node = cache.init_load_back(m_host.last_host_node, m_host.host_hit_length)
    cache.check_hicache_events()
    assert len(loaded) == 4 and node.value.tolist() == loaded.tolist() != before.tolist()
    assert lazy.device_indices.tolist() == before.tolist()  # match-time slots, not the new ones
    assert m_host.device_indices.numel() == 0
    allocator.free(held)
    cache.check_invariants()


def test_misses_and_a_disabled_cache_give_an_empty_int64_tensor(joins):
    for cache in (RadixCache(None, None), RadixCache(None, None, disable=True)):
        cache.insert([1, 2, 3])
        m = cache.match_prefix([7, 8])
        assert m.device_prefix_len == 0 and m.last_device_node is cache.root
        assert m.device_indices.dtype == torch.int64 and m.device_indices.numel() == 0
    assert joins == [0, 0]


def test_a_result_unpacks_like_the_former_named_tuple():
    cache = RadixCache(None, None)
    cache.insert([1, 2, 3])
    indices, last_device, last_host, host_len = cache.match_prefix([1, 2, 3, 4])
    assert indices.tolist() == [1, 2, 3] and last_device is last_host and host_len == 0
    assert "device_prefix_len=2" in repr(cache.match_prefix([1, 2]))


def test_a_result_takes_a_tensor_or_slots_to_join_and_refuses_anything_else():
    root = RadixCache(None, None).root
    joined = MatchResult(torch.tensor([4, 5]), root, root)
    assert joined.device_prefix_len == 2 and joined.device_indices.tolist() == [4, 5]
    parts = [np.array([1, 2], dtype=np.int64), np.array([3], dtype=np.int64)]
    lazy = MatchResult(SlotsToJoin(parts, torch.device("cpu"), 3), root, root, 2)
    assert lazy.device_prefix_len == 3 and lazy.host_hit_length == 2
    assert lazy.device_indices.tolist() == [1, 2, 3]
    with pytest.raises(TypeError, match="device_indices must be a torch.Tensor"):
        MatchResult([1, 2], root, root)  # type: ignore[arg-type]


def test_engine_admission_joins_only_for_a_request_it_admits(joins):
    stack = build_kv_stack(
        layer_num=1, dtype=torch.float32, size=32, max_requests=2, max_context_len=64,
        head_num=1, head_dim=4,
    )  # fmt: skip
    budget = SlotBudget(stack.cache, stack.allocator, stack.req_to_token_pool)
    ids = list(range(8))
    slots = stack.allocator.alloc(8)
    stack.cache.insert(RadixKey(ids), slots)
    key = RadixKey([*ids, 9])
    assert budget.admit(key, kv_total=64, active=[]) is None  # 56 more slots: does not fit
    assert joins == [] and stack.cache.protected_size() == 0
    admitted = budget.admit(key, kv_total=12, active=[])
    assert admitted is not None and admitted.prefix.tolist() == slots.tolist()
    assert joins == [1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_match_and_join_never_sync():
    stack = build_kv_stack(
        layer_num=1, dtype=torch.float16, size=64, max_requests=2, max_context_len=64,
        head_num=1, head_dim=8, device="cuda",
    )  # fmt: skip
    cache, allocator = stack.cache, stack.allocator
    slots = [allocator.alloc(8) for _ in range(2)]
    cache.insert(RadixKey(list(range(8))), slots[0])
    cache.insert(RadixKey(list(range(16))), torch.cat(slots))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        hit, miss = cache.match_prefix(list(range(16))), cache.match_prefix([99])
        indices, empty = hit.device_indices, miss.device_indices
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert indices.is_cuda and empty.is_cuda and empty.numel() == miss.device_prefix_len == 0
    assert indices.tolist() == torch.cat(slots).tolist() and hit.device_prefix_len == 16
