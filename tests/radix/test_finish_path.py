"""The finish path's bookkeeping, done inline: a trusted request's duplicate slots freed after
its insert (its walk finds them), the leaf sets after an unlock or a load-back with a host tier
below, and a backup that finds the host pool short evicting the oldest host-only leaves."""

from __future__ import annotations

import re

import pytest

from hicache.radix import RadixKey
from tests.radix.hiradix_rig import load_all, make_cache, put, tokens_of

from .req_rig import KINDS, Rig


def duplicates(rig: Rig, trusted: bool, unfinished: bool) -> tuple:
    """Two requests with the same prompt scheduled before either is cached: the second one's
    own slots for the first one's pages are duplicates when it is cached."""
    prompt = list(range(1, 23))
    first, second = rig.schedule(prompt), rig.schedule(prompt)
    assert second.cache_protected_len == 0  # nothing cached yet: all its slots its own
    rig.cache.cache_finished_req(first, trusted=trusted)
    rig.live.remove(first)
    if unfinished:
        rig.cache.cache_unfinished_req(second, trusted=trusted)
        rig.check()
    rig.cache.cache_finished_req(second, trusted=trusted)
    rig.live.remove(second)
    rig.check()
    (shape, prefixes, nodes, sizes), *pools = rig.state()
    return re.sub(r"#\d+", "#", shape), prefixes, sorted(n[1:] for n in nodes), sizes, pools


@pytest.mark.parametrize("unfinished", [False, True])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("page_size", [1, 4])
def test_a_trusted_requests_duplicates_are_freed_as_a_checked_ones(
    kind: str, page_size: int, unfinished: bool
) -> None:
    checked = duplicates(Rig(kind, page_size), trusted=False, unfinished=unfinished)
    trusted = duplicates(Rig(kind, page_size), trusted=True, unfinished=unfinished)
    assert trusted == checked
    rig = Rig(kind, page_size)
    duplicates(rig, trusted=True, unfinished=unfinished)
    aligned = 22 - 22 % page_size
    assert rig.allocator.available_size() == rig.allocator.size - aligned  # the tree's only


def test_unlock_and_load_back_file_the_leaves_with_a_host_tier_below() -> None:
    cache = make_cache(pages=16, write_policy="write_through")
    a = tokens_of(4, seed=1)
    ab = a + tokens_of(4, seed=2)
    put(cache, a)
    put(cache, ab)
    cache.check_hicache_events()  # both backed up: A on the device, B below it
    assert cache.evict(4) == 4  # B, the only device leaf, keeps its host copy
    (node_a,) = cache.evictable_leaves()
    (node_b,) = cache.host_evictable_leaves()
    assert node_b.parent is node_a and node_a.slots is not None and node_b.slots is None
    m = cache.match_prefix(RadixKey(a))
    assert m.last_device_node is node_a
    cache.inc_lock_ref(node_a)
    assert cache.evictable_leaves() == []
    cache.dec_lock_ref(node_a)  # its only child is host-only: an evictable device leaf again
    assert cache.evictable_leaves() == [node_a]
    cache.check_invariants()
    load_all(cache, ab)  # B back on the device: the leaf now, A no longer; no host-only leaf
    assert cache.evictable_leaves() == [node_b] and cache.host_evictable_leaves() == []
    assert cache.protected_size() == 0


def test_a_backup_short_of_host_slots_evicts_the_oldest_host_only_leaf() -> None:
    cache = make_cache(pages=16, hicache_ratio=1.0, write_policy="write_through")  # 16 + 16
    a, b, c = (tokens_of(8, seed=s) for s in (1, 2, 3))
    for tokens in (a, b):
        put(cache, tokens)
        cache.check_hicache_events()
        cache.evict(8)  # host-only now
    assert cache.host_size() == 16  # the host pool is full
    put(cache, c)  # its backup evicts a (the least recently used host-only leaf), not b
    cache.check_hicache_events()
    cache.check_invariants()
    assert cache.host_size() == 16
    assert cache.match_prefix(RadixKey(a)).host_hit_length == 0
    assert cache.match_prefix(RadixKey(b)).host_hit_length == 8
    cache.evict(8)  # c was backed up: it stays as a host hit
    assert cache.match_prefix(RadixKey(c)).host_hit_length == 8
