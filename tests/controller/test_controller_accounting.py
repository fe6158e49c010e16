"""HiCacheController slot accounting and bad input: nothing leaks, nothing is freed twice."""

from __future__ import annotations

import pytest
import torch

from hicache.controller import HiCacheController
from hicache.pools import TokenToKVPoolAllocator
from tests.controller.helpers import make_rig, slot_counts


def test_host_full_write_returns_none_and_queues_nothing():
    rig = make_rig(pages=4, ratio=1.5)
    ctrl = rig.controller
    slots = rig.allocator.alloc(4)
    hold = rig.host_pool.alloc(rig.host_pool.available_size() - 2)
    before = slot_counts(rig)
    assert ctrl.write(slots, node_id=1) is None
    assert slot_counts(rig) == before and ctrl.write_queue == []
    assert ctrl.write(slots[:2], node_id=2) is not None
    assert rig.host_pool.available_size() == 0
    rig.host_pool.free(hold)


def test_device_short_load_returns_none_and_queues_nothing():
    rig = make_rig(pages=4)
    ctrl = rig.controller
    host_indices = rig.host_pool.alloc(3)
    rig.allocator.alloc(2)
    before = slot_counts(rig)
    assert ctrl.load(host_indices, node_id=1) is None
    assert slot_counts(rig) == before and ctrl.load_queue == []
    assert ctrl.start_loading() == -1


def test_write_and_load_take_exactly_their_slots():
    rig = make_rig(page_size=4, pages=8)
    ctrl = rig.controller
    dev_free, host_free = slot_counts(rig)
    slots = rig.allocator.alloc(8)
    host_indices = ctrl.write(slots, node_id=1)
    assert slot_counts(rig) == (dev_free - 8, host_free - 8)
    ctrl.start_writing()
    loaded = ctrl.load(host_indices, node_id=2)
    ctrl.start_loading()
    assert slot_counts(rig) == (dev_free - 16, host_free - 8)
    assert ctrl.evict_device(slots) == 8 and ctrl.evict_device(loaded) == 8
    assert ctrl.evict_host(host_indices) == 8
    assert slot_counts(rig) == (dev_free, host_free)
    rig.allocator.check_invariants()
    rig.host_pool.check_invariants()


def test_evicting_twice_raises_and_changes_nothing():
    rig = make_rig()
    ctrl = rig.controller
    slots = rig.allocator.alloc(2)
    host_indices = ctrl.write(slots, node_id=1)
    ctrl.evict_device(slots)
    ctrl.evict_host(host_indices)
    before = slot_counts(rig)
    with pytest.raises(ValueError):
        ctrl.evict_device(slots)
    with pytest.raises(ValueError):
        ctrl.evict_host(host_indices)
    assert slot_counts(rig) == before


def test_reset_with_queued_and_issued_ops_frees_nothing_twice():
    rig = make_rig(pages=8)
    ctrl = rig.controller
    full = slot_counts(rig)
    issued = ctrl.write(rig.allocator.alloc(2), node_id=1)
    ctrl.start_writing()
    ctrl.load(issued, node_id=2)
    ctrl.start_loading()
    queued_host = ctrl.write(rig.allocator.alloc(2), node_id=3)
    queued_dev = ctrl.load(issued, node_id=4)
    held = slot_counts(rig)
    ctrl.reset()
    assert ctrl.write_queue == [] and ctrl.load_queue == []
    assert ctrl.ack_write_queue == [] and ctrl.ack_load_queue == []
    assert ctrl.layer_done_counter.producer_index == -1
    assert slot_counts(rig) == held, "reset must leave slot ownership to the radix cache"
    rig.allocator.clear()
    rig.host_pool.clear()
    assert slot_counts(rig) == full
    with pytest.raises(ValueError):
        ctrl.evict_device(queued_dev)
    with pytest.raises(ValueError):
        ctrl.evict_host(queued_host)
    assert ctrl.start_loading() == -1
    ctrl.start_writing()
    assert ctrl.ack_write_queue == [] and ctrl.ack_load_queue == []


def test_controller_works_again_after_reset():
    rig = make_rig()
    ctrl = rig.controller
    ctrl.write(rig.allocator.alloc(1), node_id=1)
    ctrl.reset()
    host_indices = ctrl.write(rig.allocator.alloc(1), node_id=2)
    ctrl.start_writing()
    ctrl.load(host_indices, node_id=3)
    assert ctrl.start_loading() == 0
    assert [a.node_ids for a in ctrl.ack_write_queue] == [[2]]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"write_policy": "write_around"}, "write_policy"),
        ({"io_backend": "cuda_memcpy"}, "io_backend"),
    ],
)
def test_unknown_policy_or_backend_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_rig(**kwargs)


@pytest.mark.parametrize(
    ("io_backend", "layout"),
    [("kernel", "page_first_direct"), ("direct", "page_first"), ("direct", "page_head")],
)
def test_layout_that_does_not_support_the_backend_raises(io_backend, layout):
    rig = make_rig(layout=layout, io_backend="direct" if io_backend == "kernel" else "kernel")
    with pytest.raises(ValueError, match="layout"):
        HiCacheController(rig.allocator, rig.host_pool, 1, io_backend=io_backend)


def test_every_write_policy_is_accepted():
    for policy in ("write_through", "write_through_selective", "write_back"):
        assert make_rig(write_policy=policy).controller.write_policy == policy


def test_page_size_must_match_the_pools():
    rig = make_rig(page_size=4)
    with pytest.raises(ValueError, match="page_size"):
        HiCacheController(rig.allocator, rig.host_pool, 2)


def test_host_pool_of_another_device_pool_with_other_layers_raises():
    rig = make_rig(layers=3)
    other = make_rig(layers=2)
    with pytest.raises(ValueError, match="layers"):
        HiCacheController(rig.allocator, other.host_pool, 1)


def test_allocator_without_device_pool_raises():
    rig = make_rig()
    bare = TokenToKVPoolAllocator(rig.allocator.size, 1)
    with pytest.raises(ValueError, match="get_kvcache"):
        HiCacheController(bare, rig.host_pool, 1)


def test_load_cache_event_needs_set():
    rig = make_rig()
    with pytest.raises(TypeError, match="load_cache_event"):
        HiCacheController(rig.allocator, rig.host_pool, 1, load_cache_event=object())


@pytest.mark.parametrize(
    ("indices", "error"),
    [
        ([1, 2], TypeError),
        (torch.tensor([1, 2], dtype=torch.int32), TypeError),
        (torch.tensor([[1, 2]]), TypeError),
        (torch.empty(0, dtype=torch.int64), ValueError),
        (torch.tensor([4, 5, 6]), ValueError),
    ],
)
def test_bad_indices_raise_before_any_change(indices, error):
    rig = make_rig(page_size=2)
    ctrl = rig.controller
    before = slot_counts(rig)
    with pytest.raises(error):
        ctrl.write(indices, node_id=1)
    with pytest.raises(error):
        ctrl.load(indices, node_id=1)
    assert slot_counts(rig) == before
    assert ctrl.write_queue == [] and ctrl.load_queue == []
