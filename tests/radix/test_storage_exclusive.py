"""Exclusive host<->storage tiering (``StorageConfig.tiering="exclusive"``): storage is written
from the host tier's evictions, deduplicated, and a failed write drops the page, never serves a
wrong one; inclusive stays as it was."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable

import pytest
import torch

from hicache import KVStack
from hicache.backends.memory import MemoryStorage
from hicache.radix import RadixKey
from hicache.tiers.storage.storage_tiering import HIGH_WATERMARK
from tests.radix.storage_helpers import (
    PAGE,
    kv_of,
    load,
    make_stack,
    prefetch,
    random_ids,
    storage_config,
    write_prefix,
)


def _exclusive(backend: MemoryStorage | None = None, **kw: object) -> KVStack:
    return make_stack(storage_config(backend or MemoryStorage(), tiering="exclusive"), **kw)


def _to_host_only(stack: KVStack) -> None:
    """Evict the whole device tier: every backed-up node stays as a host-only node."""
    stack.cache.evict(10_000)


@pytest.mark.parametrize("backend", ["memory", "file"])
def test_written_only_on_host_eviction_then_served_back_exact(tmp_path, backend):
    store = MemoryStorage() if backend == "memory" else None
    cfg = storage_config(store or tmp_path, tiering="exclusive")
    stack = make_stack(cfg)
    cache, ids = stack.cache, random_ids(64)
    expected = write_prefix(stack, ids, seed=3)
    _to_host_only(stack)
    stats = cache.stats().storage
    assert stats.backup_pages == 0 and stats.bytes_written == 0  # host write landed: nothing
    assert cache.host_size() == 64
    assert cache.evict_host(64) == 64  # written first, then evicted
    stats = cache.stats().storage
    assert stats.backup_pages == stats.eviction_write_pages == 64 // PAGE
    assert cache.host_size() == 0 and stats.pending_backups == 0
    assert len(cache.match_prefix(RadixKey(ids)).device_indices) == 0  # gone from the tree
    for part in stack.kv_pool.part_buffers:  # poison: bytes not loaded from storage show
        for layer in part:
            layer.fill_(-7.0)
    assert prefetch(cache, "r", ids) == 64
    host_hit, slots = load(stack, ids)
    assert host_hit == 64
    for want, got in zip(expected, kv_of(stack, slots), strict=True):
        assert torch.equal(want, got)
    cache.check_invariants()


def test_a_page_in_storage_is_not_written_again():
    store = MemoryStorage()
    stack = _exclusive(store)
    cache, ids = stack.cache, random_ids(32)
    write_prefix(stack, ids)
    _to_host_only(stack)
    cache.evict_host(32)
    written = cache.stats().storage.bytes_written
    assert prefetch(cache, "r", ids) == 32  # back on the host: the object stays in the store
    assert cache.host_size() == 32 and store.get_stats()["objects"] == 2 * 32 // PAGE
    assert cache.evict_host(32) == 32
    stats = cache.stats().storage
    assert stats.bytes_written == written and stats.backup_pages == 32 // PAGE  # deduplicated
    assert prefetch(cache, "r2", ids) == 32
    cache.check_invariants()


def test_only_the_evicted_leaf_is_written_not_its_host_ancestors():
    stack = _exclusive()
    cache, ids = stack.cache, random_ids(48)
    write_prefix(stack, ids[:16])
    write_prefix(stack, ids)  # a child of 32 tokens below the first 16
    _to_host_only(stack)
    assert cache.evict_host(1) == 32  # the leaf only
    stats = cache.stats().storage
    assert stats.eviction_write_pages == 32 // PAGE and cache.host_size() == 16
    assert cache.evict_host(16) == 16
    assert cache.stats().storage.eviction_write_pages == 48 // PAGE
    assert prefetch(cache, "r", ids) == 48  # the whole chain, parent written after its child
    cache.check_invariants()


class _FlakyStorage(MemoryStorage):
    """Refuses every write of a batch whose first key ``fail`` picks (a failed page is a
    miss), each time it is tried."""

    def __init__(self, fail: Callable[[str], bool]) -> None:
        super().__init__()
        self.fail = fail

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        if self.fail(keys[0]):
            return [False] * len(keys)
        return super().batch_set_v1(keys, host_indices, extra_info)


def test_a_failed_write_drops_the_leaf_and_serves_nothing():
    stack = _exclusive(_FlakyStorage(lambda _key: True))
    cache, ids = stack.cache, random_ids(32)
    write_prefix(stack, ids)
    _to_host_only(stack)
    assert cache.evict_host(32) == 32  # dropped once its write failed: eviction still frees
    stats = cache.stats().storage
    assert stats.eviction_dropped_pages == 32 // PAGE and stats.backup_pages == 0
    assert cache.host_size() == 0 and stats.pending_backups == 0
    assert prefetch(cache, "r", ids) == 0
    assert len(cache.match_prefix(RadixKey(ids)).device_indices) == 0
    cache.check_invariants()


def _kv(ids: list[int], part: int, layer_id: int, like: torch.Tensor) -> torch.Tensor:
    """The KV of ``ids`` shaped as ``like`` (``[len(ids), ...]``): it depends only on each
    token and its position, so one prefix has one set of bytes."""
    pos = torch.arange(len(ids), dtype=torch.float32)
    value = torch.tensor(ids, dtype=torch.float32) * 1e-3 + pos * 1e-1 + layer_id + 10 * part
    shape = (len(ids),) + (1,) * (like.dim() - 1)
    return value.reshape(shape).expand_as(like).to(like.dtype)


def _fill(stack: KVStack, ids: list[int], slots: torch.Tensor) -> None:
    for p, part in enumerate(stack.kv_pool.part_buffers):
        for layer_id, layer in enumerate(part):
            layer[slots] = _kv(ids, p, layer_id, layer[slots])


def _check_served(stack: KVStack, ids: list[int], req: str) -> int:
    """Match, prefetch and load ``ids``; assert every token served carries its own bytes."""
    prefetch(stack.cache, req, ids)
    _, slots = load(stack, ids)
    for p, part in enumerate(stack.kv_pool.part_buffers):
        for layer_id, layer in enumerate(part):
            got = layer[slots]
            assert torch.equal(got, _kv(ids[: len(slots)], p, layer_id, got)), "a corrupt page"
    return len(slots)


def test_a_flaky_backend_loses_only_what_left_the_tree_and_serves_nothing_corrupt():
    rng = random.Random(7)
    stack = _exclusive(
        _FlakyStorage(lambda key: zlib.crc32(key.encode()) % 3 == 0), size=128, ratio=2.0
    )
    cache = stack.cache
    heads = [random_ids(16, seed=s) for s in range(4)]
    seqs = [
        rng.choice(heads) + random_ids(rng.choice([8, 16, 32]), seed=100 + i) for i in range(40)
    ]
    served = 0
    for i, ids in enumerate(seqs):
        m = cache.match_prefix(RadixKey(ids))
        if m.host_hit_length or len(m.device_indices) < len(ids):
            served += _check_served(stack, ids, f"r{i}")
        slots = stack.allocator.alloc(len(ids))
        if slots is None:
            cache.evict(len(ids))
            slots = stack.allocator.alloc(len(ids))
        assert slots is not None
        _fill(stack, ids, slots)
        stack.allocator.free(slots[: cache.insert(RadixKey(ids), slots)])  # duplicates
        cache.check_hicache_events()
        cache.check_invariants()
    stats = cache.stats().storage
    assert stats.eviction_write_pages > 0 and stats.eviction_dropped_pages > 0 and served > 0
    cache.drain_transfers()
    cache.check_invariants()


def test_write_ahead_above_the_high_watermark():
    stack = _exclusive(size=64, ratio=2.0)
    cache = stack.cache
    capacity = cache.host_tier.controller.mem_pool_host.size
    seqs = [random_ids(16, seed=s) for s in range(capacity // 16)]
    for ids in seqs[:-1]:  # below the watermark: no write ahead
        write_prefix(stack, ids)
        _to_host_only(stack)
    cache.check_hicache_events()
    assert cache.host_size() <= HIGH_WATERMARK * capacity
    assert cache.stats().storage.eviction_write_pages == 0
    write_prefix(stack, seqs[-1])
    _to_host_only(stack)
    cache.check_hicache_events()  # full host: the coldest leaves are written ahead
    cache.drain_transfers()
    assert cache.stats().storage.eviction_write_pages > 0
    assert cache.evict_host(16) == 16 and cache.stats().storage.eviction_dropped_pages == 0
    cache.check_invariants()


def test_inclusive_writes_when_the_host_write_lands():
    stack = make_stack(storage_config(MemoryStorage()))
    cache = stack.cache
    write_prefix(stack, random_ids(32))
    stats = cache.stats().storage
    assert stats.backup_pages == 32 // PAGE and stats.eviction_write_pages == 0
    _to_host_only(stack)
    assert cache.evict_host(32) == 32
    assert cache.stats().storage.backup_pages == 32 // PAGE


@pytest.mark.parametrize("tiering", ["inclusive", "exclusive"])
def test_a_page_the_store_evicted_is_written_again(tiering):
    """A capped store that evicts a page on its own: the tier forgets it, so the next time the
    host lets it go (exclusive) or backs it up (inclusive) it is written again and hits."""
    first, second = random_ids(32, seed=5), random_ids(32, seed=6)
    probe_store = MemoryStorage()
    probe = make_stack(storage_config(probe_store, tiering=tiering))
    write_prefix(probe, first)
    _to_host_only(probe)
    probe.cache.evict_host(32)
    probe.cache.drain_transfers()
    one_prefix = probe_store.get_stats()["bytes_used"]  # what 32 tokens take in the store
    store = MemoryStorage(max_bytes=one_prefix)  # room for exactly one prefix
    stack = make_stack(storage_config(store, tiering=tiering))
    cache = stack.cache
    for ids in (first, second, first):  # the second prefix pushes the first out of the store
        write_prefix(stack, ids)
        _to_host_only(stack)
        cache.evict_host(32)
        cache.drain_transfers()
        cache.check_hicache_events()
    assert prefetch(cache, "r", first) == 32  # written again after the store had evicted it
    assert prefetch(cache, "s", second) == 0  # and that pushed the second one out
