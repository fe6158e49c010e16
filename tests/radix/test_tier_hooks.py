"""The tier hooks every cache has: RadixCache's no-ops (validated) and HiRadixCache's
``drain_transfers`` / ``consume_load_batch`` / ``HostTier.transfer_locks``."""

from __future__ import annotations

import pytest
import torch

from hicache.radix import RadixCache

from .fakes import FakeAllocator
from .hiradix_rig import make_cache, put


def test_radix_cache_tier_hooks_are_neutral() -> None:
    alloc = FakeAllocator(16, 2)
    cache = RadixCache(None, alloc, page_size=2)
    cache.insert([1, 2, 3, 4], alloc.alloc(4))
    node = cache.match_prefix([1, 2, 3, 4]).last_host_node
    before = (cache.evictable_size(), cache.protected_size())
    loaded, last = cache.init_load_back(node, 4, mem_quota=8)
    assert loaded.dtype == torch.int64 and loaded.numel() == 0 and last is node
    assert cache.init_load_back(cache.root, 0)[1] is cache.root
    assert cache.ready_to_load_host_cache() == -1
    assert cache.check_hicache_events() is None and cache.drain_transfers() is None
    assert cache.host_size() == 0 and cache.evict_host(5) == 0
    cache.consume_load_batch(-1)
    assert (cache.evictable_size(), cache.protected_size()) == before
    cache.check_invariants()


@pytest.mark.parametrize(
    ("call", "error", "word"),
    [
        (lambda c: c.init_load_back("node", 0), TypeError, "node"),
        (lambda c: c.init_load_back(c.root, -1), ValueError, "host_hit_length"),
        (lambda c: c.init_load_back(c.root, 0, mem_quota=-1), ValueError, "mem_quota"),
        (lambda c: c.init_load_back(c.root, 1.5), TypeError, "host_hit_length"),
        (lambda c: c.evict_host(-1), ValueError, "num_tokens"),
        (lambda c: c.evict_host("1"), TypeError, "num_tokens"),
        (lambda c: c.consume_load_batch(0), ValueError, "index"),
        (lambda c: c.consume_load_batch(True), TypeError, "index"),
        (lambda c: c.consume_load_batch(None), TypeError, "index"),
    ],
)
def test_radix_cache_tier_hooks_validate(call, error, word) -> None:
    cache = RadixCache(None, None)
    with pytest.raises(error, match=word):
        call(cache)


def test_radix_cache_init_load_back_refuses_a_node_of_another_tree() -> None:
    cache, other = RadixCache(None, None), RadixCache(None, None)
    other.insert([1, 2])
    with pytest.raises(ValueError, match="not in this tree"):
        cache.init_load_back(other.match_prefix([1, 2]).last_host_node, 0)


def test_drain_transfers_lands_writes_and_unlocks_their_nodes() -> None:
    cache = make_cache(page_size=2)
    calls = []
    original = cache.cache_controller.drain
    cache.cache_controller.drain = lambda: calls.append(1) or original()  # type: ignore[method-assign]
    put(cache, list(range(1, 9)))
    assert cache.protected_size() == 0 and not cache.host_tier.transfer_locks()
    cache.drain_transfers()
    assert calls == [1] and cache.protected_size() == 0
    cache.check_invariants()


def test_transfer_locks_count_the_pending_transfers(monkeypatch) -> None:
    cache = make_cache(page_size=2)
    monkeypatch.setattr(cache.cache_controller, "start_writing", lambda: None)  # writes stay queued
    put(cache, list(range(1, 9)))
    node = cache.match_prefix(list(range(1, 9))).last_device_node
    assert cache.host_tier.transfer_locks() == {node.id: 1}
    assert node.lock_ref == 1 and cache.protected_size() == 8
    monkeypatch.undo()
    cache.drain_transfers()
    assert not cache.host_tier.transfer_locks() and node.lock_ref == 0
    cache.check_invariants()


def test_consume_load_batch_sets_the_layer_consumer() -> None:
    cache = make_cache(page_size=2)
    counter = cache.cache_controller.layer_done_counter
    with pytest.raises(ValueError, match="index"):
        cache.consume_load_batch(0)  # nothing produced yet
    with pytest.raises(TypeError, match="index"):
        cache.consume_load_batch("0")
    cache.consume_load_batch(-1)
    assert counter.consumer_index == -1
