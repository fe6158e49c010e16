"""``cache.stats()``: exact counts per tier after a small known workload, and the snapshot."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hicache.radix import RadixCache, RadixKey

from .fakes import FakeAllocator
from .hiradix_rig import DIM, HEADS, LAYERS, device_pool, make_cache, put

TOKEN_BYTES = HEADS * DIM * 4 * 2 * LAYERS  # float32 K and V of every layer
A, B = list(range(1, 9)), list(range(11, 19))


def _workload(device: str = "cpu"):
    """Insert A then A+B (backed up), demote B, match A+B (a device and a host hit), load B
    back, read layer 0 after it, then evict both tiers."""
    cache = make_cache(page_size=2, device=device)
    put(cache, A)
    put(cache, A + B)
    cache.drain_transfers()
    assert cache.evict(8) == 8
    m = cache.match_prefix(RadixKey(A + B))
    loaded, _ = cache.init_load_back(m.last_host_node, m.host_hit_length)
    assert len(loaded) == 8
    cache.consume_load_batch(cache.ready_to_load_host_cache())
    device_pool(cache).get_key_buffer(0)
    cache.consume_load_batch(-1)
    cache.drain_transfers()
    assert cache.evict(16) == 16 and cache.evict_host(16) == 16
    return cache


def test_counts_per_tier_after_a_known_workload() -> None:
    s = _workload().stats()
    assert dataclasses.astuple(s.prefix) == (1, 16, 8, 8, 2, 16)
    assert s.device.evicted_tokens == 24 and s.device.capacity_tokens == 32
    assert (s.device.evictable_tokens, s.device.protected_tokens) == (0, 0)
    assert s.host is not None
    assert (s.host.backup_tokens, s.host.load_backs, s.host.load_back_tokens) == (16, 1, 8)
    assert (s.host.evicted_tokens, s.host.size_tokens, s.host.capacity_tokens) == (16, 0, 64)
    assert (s.host.pending_writes, s.host.pending_loads) == (0, 0)


def test_cpu_transfers_count_bytes_exactly_and_time() -> None:
    t = _workload().stats().transfer
    assert t is not None
    assert (t.d2h_bytes, t.h2d_bytes) == (16 * TOKEN_BYTES, 8 * TOKEN_BYTES)
    assert (t.write_batches, t.load_batches) == (2, 1)
    assert t.d2h_seconds > 0 and t.h2d_seconds > 0
    assert (t.load_queue_tokens, t.write_queue_tokens) == (0, 0)
    assert (t.loads_in_flight, t.writes_in_flight) == (0, 0)
    assert (t.layer_waits, t.blocking_waits, t.integrity_failures) == (1, 0, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_transfers_count_bytes_and_event_time() -> None:
    t = _workload("cuda").stats().transfer
    assert t is not None
    assert (t.d2h_bytes, t.h2d_bytes) == (16 * TOKEN_BYTES, 8 * TOKEN_BYTES)
    assert (t.write_batches, t.load_batches, t.layer_waits) == (2, 1, 1)
    assert t.d2h_seconds > 0 and t.h2d_seconds > 0


def test_queued_writes_show_as_queue_depth(monkeypatch) -> None:
    cache = make_cache(page_size=2)
    monkeypatch.setattr(cache.cache_controller, "start_writing", lambda: None)
    put(cache, A)
    t, h = cache.stats().transfer, cache.stats().host
    assert t is not None and h is not None
    assert (t.write_queue_tokens, t.d2h_bytes, h.pending_writes, h.size_tokens) == (8, 0, 1, 8)


def test_device_only_cache_has_no_host_figures() -> None:
    alloc = FakeAllocator(32, 2)
    cache = RadixCache(None, alloc, page_size=2)
    cache.insert(A, alloc.alloc(8))
    cache.insert(A + B[:5], alloc.alloc(14)[:13])  # 8 cached, 4 new, the partial page not stored
    cache.match_prefix(A + B)
    assert cache.evict(4) == 4
    s = cache.stats()
    assert s.host is None and s.transfer is None
    assert dataclasses.astuple(s.prefix) == (1, 16, 12, 0, 2, 12)
    assert dataclasses.astuple(s.device)[:4] == (4, 8, 0, 32)
    assert s.device.free_tokens == alloc.available_size()
    assert s.device.eviction_seconds.count == 1  # the one evict call
    assert RadixCache(None, None).stats().device.capacity_tokens is None


def test_snapshot_is_frozen_and_counters_survive_reset() -> None:
    cache = RadixCache(None, None, page_size=2)
    cache.insert(A)
    before = cache.stats()
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.prefix.insert_calls = 0  # type: ignore[misc]
    cache.reset()
    cache.insert(A)
    after = cache.stats()
    assert before.prefix.inserted_tokens == 8 and after.prefix.inserted_tokens == 16
    assert after.device.evictable_tokens == 8
    assert after.as_dict()["prefix"]["insert_calls"] == 2 and after.as_dict()["host"] is None
