"""Byte-exact round trips through the host tier: every write policy, layout/io_backend pair,
page size 1 and 64, MHA and MLA. Invariants are checked after every step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.pools import ROUTES
from hicache.radix import RadixKey, Req
from tests.radix.hiradix_rig import (
    POLICIES,
    assert_kv,
    device_pool,
    fill_kv,
    host_accounted,
    load_all,
    make_cache,
    put,
    scramble_free,
    tokens_of,
)


def back_up(cache, *keys: list[int]) -> None:
    """Make the policy back ``keys`` up (write_back backs up on eviction by itself)."""
    if cache.write_policy == "write_through_selective":
        for key in keys:
            for _ in range(2):
                cache.match_prefix(RadixKey(key))
                cache.check_invariants()
    cache.check_hicache_events()
    cache.check_invariants()


def evict_everything(cache) -> None:
    cache.evict(cache.total_size())
    cache.check_invariants()
    assert cache.total_size() == 0
    allocator = cache.token_to_kv_pool_allocator
    assert allocator.available_size() == allocator.size
    scramble_free(cache)


@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize(("kind", "io_backend", "layout"), ROUTES)
@pytest.mark.parametrize("policy", POLICIES)
def test_round_trip_is_byte_exact(
    policy: str, kind: str, io_backend: str, layout: str, page_size: int
) -> None:
    cache = make_cache(kind, io_backend, layout, page_size, pages=8, write_policy=policy)
    pool, page = device_pool(cache), page_size
    a = tokens_of(3 * page, seed=1)
    b = a[: 2 * page] + tokens_of(2 * page, seed=2)  # shares two pages with a: splits a's node
    put(cache, a)
    put(cache, b)
    back_up(cache, a, b)
    evict_everything(cache)
    assert host_accounted(cache) and cache.host_size() == 5 * page

    m = cache.match_prefix(RadixKey(b))
    assert len(m.device_indices) == 0 and m.last_device_node is cache.root
    assert m.host_hit_length == len(b)
    assert_kv(pool, load_all(cache, b), b)

    m = cache.match_prefix(RadixKey(a))  # b's load brought a's first two pages back
    assert len(m.device_indices) == 2 * page and m.host_hit_length == page
    assert_kv(pool, load_all(cache, a), a)
    assert cache.protected_size() == 0 and host_accounted(cache)

    evict_everything(cache)  # a second trip: the host copies are still intact
    assert_kv(pool, load_all(cache, a + [7] * page), a)
    cache.check_invariants()


@pytest.mark.parametrize("policy", POLICIES)
def test_request_flow_round_trip(policy: str) -> None:
    """cache_unfinished_req/cache_finished_req back up what they insert (write_through), the
    device copy is evicted and a second request gets its prefix from the host."""
    cache = make_cache(page_size=4, pages=16, write_policy=policy)
    pool, alloc = device_pool(cache), cache.token_to_kv_pool_allocator
    rows = cache.req_to_token_pool
    prompt = tokens_of(22, seed=3)
    (row,) = rows.alloc(1)
    slots = alloc.alloc(24)
    rows.write((row, slice(0, 24)), slots.to(torch.int32))
    fill_kv(pool, slots[:22], prompt)
    req = Req(row, prompt, kv_len=10)
    cache.cache_unfinished_req(req)
    cache.check_invariants()
    req.kv_len = 22
    cache.cache_finished_req(req)
    cache.check_invariants()
    assert cache.protected_size() == 0
    if policy == "write_through":
        assert cache.host_size() == 20
    back_up(cache, prompt[:20])
    evict_everything(cache)
    assert cache.host_size() == 20 and host_accounted(cache)
    assert_kv(pool, load_all(cache, prompt), prompt[:20])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("kind", "io_backend", "layout"), ROUTES)
def test_round_trip_on_cuda(kind: str, io_backend: str, layout: str) -> None:
    cache = make_cache(kind, io_backend, layout, page_size=16, pages=8, device="cuda")
    assert cache.cache_controller.mem_pool_host.pinned
    a = tokens_of(48, seed=4)
    put(cache, a)
    back_up(cache, a)
    torch.cuda.synchronize()
    cache.check_hicache_events()
    evict_everything(cache)
    prefix = load_all(cache, a)
    torch.cuda.synchronize()
    assert_kv(device_pool(cache), prefix, a)
    cache.check_hicache_events()
    cache.check_invariants()


def test_node_values_are_tensors_with_a_host_tier_on_cpu() -> None:
    cache = make_cache(page_size=2)
    tokens = tokens_of(8, seed=3)
    slots = put(cache, tokens)
    node = cache.match_prefix(RadixKey(tokens)).last_device_node
    for tensor in (node.value, node.host_value):
        assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.int64
        assert tensor.device.type == "cpu" and tensor.shape == (8,)
        assert not np.shares_memory(tensor.numpy(), slots.numpy())
    assert torch.equal(node.value, slots)
    cache.evict(cache.total_size())
    assert node.evicted and node.value is None and isinstance(node.host_value, torch.Tensor)
    cache.check_invariants()
