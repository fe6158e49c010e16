"""cache_finished_req / cache_unfinished_req: slot ownership, duplicates, tails, locks."""

from __future__ import annotations

import pytest

from hicache.radix import RadixCache, RadixKey, Req

from .engine import MiniEngine
from .fakes import FakeAllocator, snapshot


def tree_slots(cache: RadixCache, ids, extra_key=None) -> list[int]:
    return cache.match_prefix(RadixKey(ids, extra_key)).device_indices.tolist()


@pytest.mark.parametrize("page", [1, 4])
def test_finished_req_is_cached_and_tail_freed(page):
    eng = MiniEngine(page)
    ids = list(range(1, 11))  # 10 tokens: with page 4, two pages and a 2-token tail
    req = eng.admit(ids)
    own = eng.pool.req_to_token[req.req_pool_idx, :10].tolist()
    eng.finish(req)
    aligned = 10 - 10 % page
    assert tree_slots(eng.cache, ids) == own[:aligned]
    assert eng.cache.protected_size() == 0 and req.last_node is None
    assert eng.allocator.available_size() == 256 - aligned
    eng.check()


@pytest.mark.parametrize("page", [1, 2])
def test_duplicate_slots_are_freed_and_first_copy_kept(page):
    eng = MiniEngine(page)
    ids = [5, 6, 7, 8, 9, 10]
    a, b = eng.admit(ids), eng.admit(ids)  # both missed: two copies of the same KV
    a_slots = eng.pool.req_to_token[a.req_pool_idx, :6].tolist()
    eng.finish(a)
    eng.check()
    eng.finish(b)
    assert tree_slots(eng.cache, ids) == a_slots
    assert eng.allocator.available_size() == 256 - 6
    eng.check()


def test_prefix_hit_keeps_tree_slots_and_releases_lock():
    eng = MiniEngine(1)
    eng.finish(eng.admit([1, 2, 3, 4]))
    req = eng.admit([1, 2, 3, 4, 5, 6])
    assert req.cache_protected_len == 4 and eng.cache.protected_size() == 4
    row = eng.pool.req_to_token[req.req_pool_idx, :4].tolist()
    assert row == tree_slots(eng.cache, [1, 2, 3, 4])
    eng.check()
    eng.finish(req)
    assert eng.cache.protected_size() == 0 and eng.cache.total_size() == 6
    eng.check()


def test_outputs_are_cached_except_the_last_sample():
    eng = MiniEngine(1)
    req = eng.admit([1, 2, 3])
    for token in (7, 8, 9):
        assert eng.decode(req, token)
    assert req.kv_len == 5  # prompt + 7 + 8; 9 has no KV yet
    eng.check()
    eng.finish(req)
    assert tree_slots(eng.cache, [1, 2, 3, 7, 8, 9]) == tree_slots(eng.cache, [1, 2, 3, 7, 8])
    assert eng.cache.total_size() == 5
    eng.check()


@pytest.mark.parametrize("page", [1, 4])
def test_chunked_prefill_with_unfinished_req(page):
    eng = MiniEngine(page)
    ids = list(range(20, 31))  # 11 tokens
    req = eng.admit(ids, kv_len=6)
    eng.cache.cache_unfinished_req(req)
    aligned = 6 - 6 % page
    assert req.cache_protected_len == aligned
    assert eng.cache.total_size() == aligned and eng.cache.protected_size() == aligned
    row = eng.pool.req_to_token[req.req_pool_idx, :6].tolist()
    assert req.prefix_indices.tolist() == row
    assert tree_slots(eng.cache, ids[:6]) == row[:aligned]
    eng.check()
    assert eng.compute(req, 11)
    eng.cache.cache_unfinished_req(req)
    assert req.cache_protected_len == 11 - 11 % page
    assert eng.cache.protected_size() == req.cache_protected_len
    eng.check()
    eng.finish(req)
    assert eng.cache.protected_size() == 0
    eng.check()


def test_unfinished_req_swaps_duplicates_for_tree_slots():
    eng = MiniEngine(2)
    ids = [1, 2, 3, 4, 5, 6, 7]
    a, b = eng.admit(ids), eng.admit(ids)
    eng.finish(a)
    b_row_before = eng.pool.req_to_token[b.req_pool_idx, :7].tolist()
    eng.cache.cache_unfinished_req(b)
    row = eng.pool.req_to_token[b.req_pool_idx, :7].tolist()
    assert row[:6] == tree_slots(eng.cache, ids)
    assert row[6] == b_row_before[6]  # the tail page stays the request's
    assert b.prefix_indices.tolist() == row
    eng.check()
    assert eng.decode(b, 9) and eng.decode(b, 10)
    eng.check()
    eng.finish(b)
    eng.check()


def test_namespaced_requests_do_not_share():
    eng = MiniEngine(1)
    eng.finish(eng.admit([1, 2, 3], extra_key="lora-a"))
    req = eng.admit([1, 2, 3], extra_key="lora-b")
    assert req.cache_protected_len == 0
    eng.finish(req)
    assert eng.cache.total_size() == 6
    eng.check()


def test_disabled_cache_frees_everything():
    eng = MiniEngine(2, disable=True)
    req = eng.admit([1, 2, 3, 4, 5])
    eng.cache.cache_unfinished_req(req)
    assert req.prefix_indices.tolist() == eng.pool.req_to_token[req.req_pool_idx, :5].tolist()
    eng.finish(req)
    assert eng.cache.total_size() == 0 and eng.allocator.available_size() == 256
    assert eng.pool.available_size() == 16


def test_fill_ids():
    req = Req(0, [1, 2, 3], [4, 5], kv_len=4)
    assert req.fill_ids == [1, 2, 3, 4]


def test_bad_requests_change_nothing():
    eng = MiniEngine(1)
    req = eng.admit([1, 2, 3])
    before = snapshot(eng.cache)
    req.kv_len = 9
    with pytest.raises(ValueError, match="kv_len"):
        eng.cache.cache_finished_req(req)
    assert snapshot(eng.cache) == before
    req.kv_len = 3
    locked = req.last_node
    eng.cache.insert([9, 9], eng.allocator.alloc(2))
    req.last_node = eng.cache.match_prefix([9, 9]).last_device_node
    before = snapshot(eng.cache)
    with pytest.raises(ValueError, match="not locked"):
        eng.cache.cache_unfinished_req(req)
    assert snapshot(eng.cache) == before
    req.last_node = locked
    eng.finish(req)
    eng.check()


def test_cache_req_needs_a_request_pool():
    cache = RadixCache(None, FakeAllocator(8))
    with pytest.raises(ValueError, match="req_to_token_pool"):
        cache.cache_finished_req(Req(0, [1], kv_len=1))


@pytest.mark.parametrize("page", [1, 4])
def test_against_real_pools(page):
    pools = pytest.importorskip("hicache.pools")
    try:
        allocator = pools.TokenToKVPoolAllocator(64, page_size=page, device="cpu")
        pool = pools.ReqToTokenPool(4, 32, "cpu")
    except Exception as exc:  # the pools are still being written
        pytest.skip(f"hicache.pools not usable yet: {exc}")
    eng = MiniEngine(page, allocator=allocator, pool=pool)
    a = eng.admit(list(range(1, 11)))
    b = eng.admit(list(range(1, 11)) + [50, 51])
    eng.check()
    eng.cache.cache_unfinished_req(b)
    eng.finish(a)
    eng.check()
    assert eng.decode(b, 60) and eng.decode(b, 61)
    eng.finish(b)
    eng.check()
    assert eng.cache.evict(1000) > 0 and eng.cache.total_size() == 0
    assert allocator.available_size() == 64
    eng.check()
    allocator.check_invariants()
