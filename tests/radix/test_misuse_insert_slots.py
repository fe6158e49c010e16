"""insert (and cache_*_req rows) with slots the caller does not own.

Always checked (CPU slots): range (never slot 0's reserved page), whole aligned pages, no slot
twice, held by no tree node. Under ``HICACHE_CHECK_OWNERSHIP``: allocated in the allocator.
"""

from __future__ import annotations

import dataclasses
import unittest.mock

import pytest
import torch

from hicache import env
from hicache.radix import RadixCache

from .req_rig import KINDS, Rig


@pytest.fixture(params=[(k, p) for k in KINDS for p in (1, 4)], ids=str)
def rig(request) -> Rig:
    rig = Rig(*request.param)
    rig.finish(rig.schedule(list(range(1, 9))))
    return rig


@pytest.fixture
def ownership(monkeypatch):
    monkeypatch.setattr(env, "ENV", dataclasses.replace(env.ENV, check_ownership=True))


def _fresh(rig: Rig, n: int = 8) -> torch.Tensor:
    slots = rig.allocator.alloc(n)
    assert slots is not None
    return slots


def _bad_value(rig: Rig, kind: str) -> torch.Tensor:
    p, top = rig.page_size, rig.allocator.size + rig.page_size
    good = _fresh(rig)
    if kind == "past_end":
        return torch.arange(top - 8 + p, top + p)
    if kind == "negative":
        return torch.cat([good[:-p], torch.arange(-p, 0)])
    if kind == "slot_zero":
        return torch.cat([torch.arange(p), good[p:]])
    if kind == "repeated":
        return torch.cat([good[:p], good[:p], good[2 * p :]])
    assert kind == "straddling" and p > 1
    return good + 1  # every page's slots shifted one into the next page


KINDS_BAD = ["past_end", "negative", "slot_zero", "repeated", "straddling"]


@pytest.mark.parametrize("kind", KINDS_BAD)
def test_insert_rejects_slots_it_cannot_own(rig, kind):
    if kind == "straddling" and rig.page_size == 1:
        pytest.skip("every slot is its own page at page_size 1")
    value = _bad_value(rig, kind)
    before = rig.state()
    with pytest.raises(ValueError, match="value"):
        rig.cache.insert(list(range(30, 38)), value)
    assert rig.state() == before
    rig.cache.check_invariants()
    good = _fresh(rig)
    assert rig.cache.insert(list(range(30, 38)), good) == 0
    rig.cache.check_invariants()


def test_insert_of_a_nodes_slots(rig):
    taken = rig.cache.match_prefix(list(range(1, 9))).device_indices
    before = rig.state()
    with pytest.raises(ValueError, match="tree node already owns"):
        rig.cache.insert(list(range(40, 48)), taken.clone())
    assert rig.state() == before


def test_insert_of_free_slots_needs_the_debug_switch(rig, ownership):
    free = rig.allocator.free_slots()[:8]
    before = rig.state()
    with pytest.raises(ValueError, match="free in the allocator"):
        rig.cache.insert(list(range(40, 48)), free)
    assert rig.state() == before


def test_duplicates_of_a_cached_prefix_are_still_accepted(rig, ownership):
    """The leading positions an insert finds cached are the caller's duplicates, not new."""
    dup = _fresh(rig)
    assert rig.cache.insert(list(range(1, 9)), dup) == 8
    rig.allocator.free(dup)
    rig.check()


def test_row_holding_tree_slots_past_the_lock(rig):
    """A request row claiming tree-owned slots as its own is refused in cache_finished_req."""
    req = rig.schedule(list(range(50, 62)))
    theirs = rig.cache.match_prefix(list(range(1, 9))).device_indices[: rig.page_size]
    rig.req_pool.write((req.req_pool_idx, slice(8, 8 + rig.page_size)), theirs.to(torch.int32))
    before = rig.state()
    with pytest.raises(ValueError, match="req_to_token row"):
        rig.cache.cache_finished_req(req)
    assert rig.state() == before


def test_row_repeating_a_slot_is_refused_always(rig):
    req = rig.schedule(list(range(50, 62)))
    p = rig.page_size
    first = rig.req_pool.req_to_token[req.req_pool_idx, :p].clone()
    rig.req_pool.write((req.req_pool_idx, slice(8, 8 + p)), first)
    before = rig.state()
    with pytest.raises(ValueError, match="more than once"):
        rig.cache.cache_finished_req(req)
    assert rig.state() == before


def test_insert_of_slots_on_another_device(rig):
    value = torch.empty(8, dtype=torch.int64, device="meta")  # any device but the allocator's
    before = rig.state()
    with pytest.raises(ValueError, match="device"):
        rig.cache.insert(list(range(30, 38)), value)
    assert rig.state() == before


def test_a_test_double_allocator_is_not_range_checked():
    """An allocator without integer ``size``/``page_size`` (a mock) gets no slot checks."""
    mock = unittest.mock.Mock()
    mock.device, mock.page_size = torch.device("cpu"), 1
    cache = RadixCache(None, mock, 1)
    cache.insert([1, 2], torch.tensor([10, 20]))
    assert cache.evict(2) == 2 and mock.free.called
