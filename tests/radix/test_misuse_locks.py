"""Lock misuse: unlocking a node that only a descendant locked, locking a host-only node."""

from __future__ import annotations

import pytest

from hicache.radix import HiRadixCache, RadixCache

from .fakes import snapshot
from .req_rig import KINDS, Rig


@pytest.fixture(params=KINDS)
def cache(request) -> RadixCache:
    rig = Rig(request.param, page_size=2)
    rig.finish(rig.schedule([1, 2, 3, 4]))
    rig.finish(rig.schedule([1, 2, 3, 4, 5, 6, 7, 8]))
    if isinstance(rig.cache, HiRadixCache):
        rig.cache.check_hicache_events()  # write-through backups done: nodes unlocked
    return rig.cache


def nodes(cache):
    child = cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8]).last_device_node
    return child.parent, child


def test_unlock_of_a_parent_locked_only_through_its_child(cache):
    parent, child = nodes(cache)
    cache.inc_lock_ref(child)
    before = snapshot(cache)
    with pytest.raises(ValueError, match="only through a locked descendant"):
        cache.dec_lock_ref(parent)
    assert snapshot(cache) == before
    cache.dec_lock_ref(child)
    assert cache.protected_size() == 0
    cache.check_invariants()


def test_unlock_twice_raises(cache):
    _, child = nodes(cache)
    cache.inc_lock_ref(child)
    cache.dec_lock_ref(child)
    before = snapshot(cache)
    with pytest.raises(ValueError, match="not locked"):
        cache.dec_lock_ref(child)
    assert snapshot(cache) == before
    cache.check_invariants()


def test_locks_survive_a_split(cache):
    """A lock taken before a match splits its node is undone on the same node object."""
    _, child = nodes(cache)
    cache.inc_lock_ref(child)
    cache.match_prefix([1, 2, 3, 4, 5, 6])  # splits child
    cache.check_invariants()
    with pytest.raises(ValueError):
        cache.dec_lock_ref(child.parent)  # the new upper half holds no lock of its own
    cache.dec_lock_ref(child)
    assert cache.protected_size() == 0
    cache.check_invariants()


def test_lock_of_a_host_only_node(cache):
    if not isinstance(cache, HiRadixCache):
        pytest.skip("host tier only")
    _, child = nodes(cache)
    assert child.host_value is not None
    cache.evict(cache.evictable_size())
    assert child.value is None  # host-only now
    before = snapshot(cache)
    with pytest.raises(ValueError, match="host-only"):
        cache.inc_lock_ref(child)
    assert snapshot(cache) == before
    cache.check_invariants()
    m = cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8])
    _, node = cache.init_load_back(m.last_host_node, m.host_hit_length)
    cache.ready_to_load_host_cache()
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)
    cache.check_hicache_events()
    cache.check_invariants()
