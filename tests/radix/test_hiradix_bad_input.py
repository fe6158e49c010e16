"""Bad input to HiRadixCache: a clear TypeError/ValueError, raised before any state changes."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import MHATokenToKVPool, TokenToKVPoolAllocator
from hicache.radix import HiRadixCache, RadixKey
from tests.radix.hiradix_rig import make_cache, put, snapshot, tokens_of

BAD_SETTINGS = [
    ({"write_policy": "write_sometimes"}, ValueError, "write_policy"),
    ({"io_backend": "dma"}, ValueError, "io_backend"),
    ({"mem_layout": "head_first"}, ValueError, "mem_layout"),
    ({"io_backend": "direct", "mem_layout": "page_head"}, ValueError, "not supported"),
    ({"io_backend": "kernel", "mem_layout": "page_first_direct"}, ValueError, "not supported"),
    ({"hicache_ratio": 0.0}, ValueError, "at least one page"),
    ({"hicache_size_gb": 1e-9}, ValueError, "at least one page"),
    ({"tiering": "both"}, ValueError, "tiering"),
    ({"tiering": 1}, ValueError, "tiering"),
    ({"hicache_ratio": -2.0}, ValueError, "hicache_ratio"),
    ({"hicache_ratio": "2"}, TypeError, "hicache_ratio"),
    ({"load_back_threshold": -1}, ValueError, "load_back_threshold"),
    ({"load_back_threshold": 1.5}, TypeError, "load_back_threshold"),
    ({"eviction_policy": "random"}, ValueError, "eviction_policy"),
]


@pytest.mark.parametrize(("settings", "error", "match"), BAD_SETTINGS)
def test_bad_settings_raise_clear_errors(settings: dict, error: type, match: str) -> None:
    pool = MHATokenToKVPool(16, 1, torch.float32, 2, 4, 2, "cpu")
    allocator = TokenToKVPoolAllocator(16, 1, "cpu", kvcache=pool)
    with pytest.raises(error, match=match):
        HiRadixCache(None, allocator, 1, **settings)
    assert pool.layer_transfer_counter is None, "nothing may be wired up on failure"


def test_mla_has_no_page_head_layout() -> None:
    with pytest.raises(ValueError, match="layout"):
        make_cache("mla", "kernel", "page_head")


def test_allocator_without_device_pool_is_refused() -> None:
    with pytest.raises(ValueError, match="get_kvcache"):
        HiRadixCache(None, None)
    with pytest.raises(ValueError, match="device KV pool|get_kvcache"):
        HiRadixCache(None, TokenToKVPoolAllocator(16, 1, "cpu"))


@pytest.fixture
def cache() -> HiRadixCache:
    """write_back: ``a`` is on the device only, ``b`` evicted to the host; ``a`` locked."""
    cache = make_cache(page_size=2, pages=16, write_policy="write_back")
    put(cache, tokens_of(6, seed=1))
    put(cache, tokens_of(4, seed=2))
    cache.evict(4)  # LRU: the first insert goes to the host
    cache.inc_lock_ref(cache.match_prefix(tokens_of(4, seed=2)).last_device_node)
    cache.check_invariants()
    return cache


def test_init_load_back_on_a_node_that_is_not_backed_up(cache: HiRadixCache) -> None:
    node = cache.match_prefix(tokens_of(4, seed=2)).last_device_node
    assert node is not cache.root and not node.backuped
    before = snapshot(cache)
    with pytest.raises(ValueError, match="not backed up"):
        cache.init_load_back(node, 4)
    assert snapshot(cache) == before
    cache.check_invariants()


BAD_LOADS = [
    (lambda c, n: (object(), 6), TypeError, "TreeNode"),
    (lambda c, n: (n, -1), ValueError, "host_hit_length"),
    (lambda c, n: (n, 6.0), TypeError, "host_hit_length"),
    (lambda c, n: (n, 6, -1), ValueError, "mem_quota"),
]


@pytest.mark.parametrize(("args", "error", "match"), BAD_LOADS)
def test_bad_load_arguments(cache: HiRadixCache, args, error: type, match: str) -> None:
    m = cache.match_prefix(tokens_of(6, seed=1))
    assert m.host_hit_length == 6
    before = snapshot(cache)
    with pytest.raises(error, match=match):
        cache.init_load_back(*args(cache, m.last_host_node))
    assert snapshot(cache) == before


def test_node_of_another_cache_is_refused(cache: HiRadixCache) -> None:
    other = make_cache(page_size=2, pages=16)
    put(other, tokens_of(6, seed=1))
    before = snapshot(cache)
    with pytest.raises(ValueError, match="not in this tree"):
        cache.init_load_back(other.match_prefix(tokens_of(6, seed=1)).last_host_node, 6)
    assert snapshot(cache) == before


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c: c.evict_host(-1), ValueError),
        (lambda c: c.evict_host("1"), TypeError),
        (lambda c: c.evict(-1), ValueError),
        (lambda c: c.reset(), ValueError),
        (lambda c: c.insert(RadixKey([1, 2]), None), ValueError),
    ],
)
def test_bad_calls_leave_both_tiers_unchanged(cache: HiRadixCache, call, error: type) -> None:
    before = snapshot(cache)
    with pytest.raises(error):
        call(cache)
    assert snapshot(cache) == before
    cache.check_invariants()


def test_root_lock_is_a_no_op(cache: HiRadixCache) -> None:
    before = snapshot(cache)
    assert cache.inc_lock_ref(cache.root) == 0
    assert cache.dec_lock_ref(cache.root) == 0
    assert snapshot(cache) == before
    loaded, node = cache.init_load_back(cache.root, 0)
    assert node is cache.root and len(loaded) == 0


def test_another_caches_root_is_not_a_no_op_here(cache: HiRadixCache) -> None:
    other = make_cache(page_size=2, pages=16)
    before = snapshot(cache)
    for call in (cache.inc_lock_ref, cache.dec_lock_ref):
        with pytest.raises(ValueError, match="not in this tree"):
            call(other.root)
    assert snapshot(cache) == before
