"""Misuse: host-tier settings that are not finite numbers. ``HiCacheConfig`` (and so
``HiRadixCache``) refuses them with a ValueError/TypeError naming the argument, before any pool
is built, instead of an OverflowError or "cannot convert float NaN" from the size arithmetic."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import MHATokenToKVPool, TokenToKVPoolAllocator
from hicache.radix import HiCacheConfig, HiRadixCache

BAD = [
    ("hicache_ratio", float("inf"), ValueError),
    ("hicache_ratio", float("-inf"), ValueError),
    ("hicache_ratio", float("nan"), ValueError),
    ("hicache_ratio", 1e300, ValueError),
    ("hicache_ratio", 10**400, ValueError),
    ("hicache_ratio", -1, ValueError),
    ("hicache_ratio", True, TypeError),
    ("hicache_ratio", "2", TypeError),
    ("hicache_size_gb", float("inf"), ValueError),
    ("hicache_size_gb", float("nan"), ValueError),
    ("hicache_size_gb", 1e300, ValueError),
    ("hicache_size_gb", 10**400, ValueError),
    ("hicache_size_gb", -0.5, ValueError),
    ("hicache_size_gb", None, TypeError),
    ("load_back_threshold", True, TypeError),
    ("load_back_threshold", 1.5, TypeError),
]


@pytest.fixture
def allocator() -> TokenToKVPoolAllocator:
    pool = MHATokenToKVPool(32, 1, torch.float32, 2, 8, 2, "cpu")
    return TokenToKVPoolAllocator(32, 1, "cpu", pool)


@pytest.mark.parametrize("name, value, error", BAD, ids=lambda v: repr(v)[:20])
def test_bad_host_setting_is_named(allocator, name, value, error) -> None:
    with pytest.raises(error, match=name):
        HiCacheConfig(**{name: value})
    free = allocator.available_size()
    with pytest.raises(error, match=name):
        HiRadixCache(None, allocator, 1, **{name: value})
    assert allocator.available_size() == free
    cache = HiRadixCache(None, allocator, 1, hicache_ratio=2.0)
    cache.check_invariants()


def test_finite_settings_at_the_bounds_are_accepted() -> None:
    assert HiCacheConfig(hicache_ratio=1e9).hicache_ratio == 1e9
    assert HiCacheConfig(hicache_size_gb=0.5, hicache_ratio=0).hicache_size_gb == 0.5


def test_config_object_builds_the_same_cache(allocator) -> None:
    config = HiCacheConfig(hicache_ratio=3.0, write_policy="write_back", load_back_threshold=4)
    cache = HiRadixCache(None, allocator, 1, config=config)
    assert cache.hi_config is config
    assert cache.write_policy == "write_back"
    assert cache.cache_controller.mem_pool_host.size == 96


@pytest.mark.parametrize(
    "config, keywords, error",
    [
        (HiCacheConfig(), {"write_policy": "write_back"}, ValueError),
        ({"hicache_ratio": 3.0}, {}, TypeError),
    ],
)
def test_config_with_keywords_or_a_dict_is_refused(allocator, config, keywords, error) -> None:
    with pytest.raises(error, match="config|write_policy"):
        HiRadixCache(None, allocator, 1, config=config, **keywords)
    assert allocator.available_size() == 32
