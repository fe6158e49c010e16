"""Each TP decision of HiRadixCache, on rank 0 of a two-rank group whose peer is scripted
(``tp_peer.PeerGroup``): when the peer's own state differs, this rank follows the agreed value
and its state stays exact."""

from __future__ import annotations

import pytest
import torch

from hicache.radix import RadixKey
from hicache.tp import TPError, TPGroup, TPPeerError
from tests.radix.hiradix_rig import assert_kv, device_pool, load_all, make_cache, put, tokens_of
from tests.radix.tp_peer import PeerGroup, failed_peer, zeros_after_status

PAGE = 4


def _cache(tp: TPGroup, **kwargs: object):
    return make_cache("mha", page_size=PAGE, pages=16, tp_group=tp, **kwargs)


def _host_free(cache) -> int:
    return cache.cache_controller.mem_pool_host.available_size()


def test_a_backup_the_peer_cannot_host_is_not_made_here_either():
    tp = PeerGroup()
    tp.peer["host backup allocation"] = zeros_after_status
    cache = _cache(tp)
    before = _host_free(cache)
    put(cache, tokens_of(16, 1))
    cache.check_hicache_events()
    assert cache.host_size() == 0 and _host_free(cache) == before
    assert all(n.host_slots is None for n in cache.tree.nodes())
    cache.check_invariants()
    del tp.peer["host backup allocation"]  # the peer has room again: the next hit backs up
    cache.match_prefix(RadixKey(tokens_of(16, 1)))
    cache.check_hicache_events()
    assert cache.host_size() == 16 and _host_free(cache) == before - 16


def test_finished_writes_are_released_only_once_the_peer_has_finished_them():
    tp = PeerGroup()
    cache = _cache(tp)
    tp.peer["check_hicache_events"] = zeros_after_status  # the peer's writes are still running
    put(cache, tokens_of(16, 2))
    for _ in range(3):
        cache.check_hicache_events()
        assert cache.stats().host.pending_writes == 1
        assert cache.evict(16) == 0  # the written node stays locked
    del tp.peer["check_hicache_events"]
    cache.check_hicache_events()
    assert cache.stats().host.pending_writes == 0
    assert cache.evict(16) == 16 and cache.host_size() == 16  # kept as host-only
    cache.check_invariants()


def test_insert_neither_issues_nor_releases_under_tp():
    tp = PeerGroup()
    cache = _cache(tp)
    put(cache, tokens_of(16, 3))
    assert "check_hicache_events" not in tp.wheres()
    assert cache.stats().host.pending_writes == 1  # released by the step, not by insert
    cache.check_hicache_events()
    assert cache.stats().host.pending_writes == 0


def test_a_load_back_the_peer_cannot_place_is_not_made_here_either():
    tp = PeerGroup()
    cache = _cache(tp)
    ids = tokens_of(16, 4)
    put(cache, ids)
    cache.check_hicache_events()
    assert cache.evict(16) == 16
    free = cache.token_to_kv_pool_allocator.available_size()
    tp.peer["load-back allocation"] = zeros_after_status
    m = cache.match_prefix(RadixKey(ids))
    got, last = cache.init_load_back(m.last_host_node, m.host_hit_length)
    assert got.numel() == 0 and last is cache.root
    assert cache.token_to_kv_pool_allocator.available_size() == free
    assert cache.ready_to_load_host_cache() == -1  # nothing was left queued
    cache.check_invariants()
    del tp.peer["load-back allocation"]
    assert_kv(device_pool(cache), load_all(cache, ids), ids)


def test_a_peer_that_failed_stops_this_rank_too_without_a_change():
    tp = PeerGroup()
    cache = _cache(tp)
    put(cache, tokens_of(16, 5))
    tp.peer["check_hicache_events"] = failed_peer
    with pytest.raises(TPPeerError, match="rank 1 failed at check_hicache_events"):
        cache.check_hicache_events()
    assert cache.stats().host.pending_writes == 1
    del tp.peer["check_hicache_events"]
    cache.check_hicache_events()
    assert cache.stats().host.pending_writes == 0
    cache.check_invariants()


def test_this_ranks_failure_is_raised_after_the_agreement(monkeypatch):
    tp = PeerGroup()
    cache = _cache(tp)
    put(cache, tokens_of(16, 6))

    def broken() -> None:
        raise OSError("copy failed")

    monkeypatch.setattr(cache.cache_controller, "start_writing", broken)
    with pytest.raises(OSError, match="copy failed"):
        cache.check_hicache_events()
    where, words = tp.seen[-1]
    assert where == "check_hicache_events" and words[0] == 0  # told the peer: rank 0 failed
    monkeypatch.undo()
    cache.check_hicache_events()
    assert cache.stats().host.pending_writes == 0


def test_a_page_corrupt_on_the_peer_is_dropped_on_every_rank():
    tp = PeerGroup()
    cache = _cache(tp, verify="all")
    ids = tokens_of(16, 7)
    put(cache, ids)
    cache.check_hicache_events()
    cache.evict(16)
    tp.peer["verified load-back"] = lambda w: [w[0], 8]  # the peer's page 2 differs
    m = cache.match_prefix(RadixKey(ids))
    got, _ = cache.init_load_back(m.last_host_node, m.host_hit_length)
    assert got.numel() == 0  # one node: dropped from its first bad page on
    assert cache.host_size() == 0
    cache.check_invariants()


def test_debug_digests_that_differ_raise():
    tp = PeerGroup(debug=True)
    cache = _cache(tp)
    cache.check_hicache_events()
    tp.peer["check_hicache_events"] = lambda w: [w[0], w[1] - 1, *w[2:]]
    with pytest.raises(TPError, match="diverged"):
        cache.check_hicache_events()


def test_digest_ignores_slot_ids_but_not_state():
    a, b = _cache(TPGroup()), _cache(TPGroup())
    ids = tokens_of(16, 8)
    taken = b.token_to_kv_pool_allocator.alloc(8)  # b's slots for ids differ from a's
    put(a, ids)
    slots = b.token_to_kv_pool_allocator.alloc(16)
    b.insert(RadixKey(ids), slots)
    b.token_to_kv_pool_allocator.free(taken)
    assert not torch.equal(slots, a.match_prefix(RadixKey(ids)).device_indices)
    b.match_prefix(RadixKey(ids))
    a.check_hicache_events()
    b.check_hicache_events()
    assert a.tree_digest() == b.tree_digest()
    a.match_prefix(RadixKey(ids))  # one more hit on a
    assert a.tree_digest() != b.tree_digest()


def test_keep_if_all_gives_back_what_only_this_rank_got():
    given: list[object] = []
    tp = PeerGroup()
    assert tp.keep_if_all("slots", given.append, where="a") == "slots" and given == []
    assert tp.keep_if_all(None, given.append, where="a") is None and given == []
    tp.peer["b"] = zeros_after_status  # the peer's allocation failed
    assert tp.keep_if_all("slots", given.append, where="b") is None and given == ["slots"]
