"""Issue 12, HiCacheController.write / load arguments: rejected before any slot is allocated."""

from __future__ import annotations

import pytest
import torch

from tests.controller.helpers import make_rig


def counts(rig) -> tuple[int, int, int, int]:
    ctrl = rig.controller
    return (
        rig.allocator.available_size(),
        rig.host_pool.available_size(),
        len(ctrl.write_queue),
        len(ctrl.load_queue),
    )


@pytest.mark.parametrize("node_id", [True, 1.0, "1", None], ids=repr)
def test_write_and_load_reject_non_int_node_ids(node_id):
    rig = make_rig()
    slots = rig.allocator.alloc(2)
    host = rig.host_pool.alloc(2)
    before = counts(rig)
    with pytest.raises(TypeError, match="node_id"):
        rig.controller.write(slots, node_id)
    with pytest.raises(TypeError, match="node_id"):
        rig.controller.load(host, node_id)
    assert counts(rig) == before
    assert rig.controller.write(slots, 7) is not None


def test_indices_on_another_device_name_the_device():
    """The check compares whole devices (``meta`` is neither the pool's nor the CPU)."""
    rig = make_rig()
    before = counts(rig)
    with pytest.raises(ValueError, match="device_indices must be on cpu"):
        rig.controller.write(torch.zeros(2, dtype=torch.int64, device="meta"), 1)
    with pytest.raises(ValueError, match="host_indices must be on cpu"):
        rig.controller.load(torch.zeros(2, dtype=torch.int64, device="meta"), 1)
    assert counts(rig) == before


def test_write_into_given_host_slots_checks_them_first():
    rig = make_rig()
    slots = rig.allocator.alloc(2)
    host = rig.host_pool.alloc(4)
    before = counts(rig)
    with pytest.raises(ValueError, match="host_indices has 4 slots, expected 2"):
        rig.controller.write(slots, 3, host)
    with pytest.raises(TypeError, match="host_indices"):
        rig.controller.write(slots, 3, host[:2].tolist())
    assert counts(rig) == before
    assert torch.equal(rig.controller.write(slots, 3, host[:2]), host[:2])
    assert len(rig.controller.write_queue) == 1
    assert counts(rig)[1] == before[1]  # nothing more taken from the host pool


def test_unqueue_load_takes_back_only_the_last_queued_load():
    rig = make_rig()
    host = rig.host_pool.alloc(4)
    free = rig.allocator.available_size()
    assert rig.controller.load(host[:2], 1) is not None
    assert rig.controller.load(host[2:], 2) is not None
    with pytest.raises(ValueError, match="not node 1's"):
        rig.controller.unqueue_load(1)
    rig.controller.unqueue_load(2)
    assert len(rig.controller.load_queue) == 1
    assert rig.allocator.available_size() == free - 2
    rig.controller.unqueue_load(1)
    assert rig.allocator.available_size() == free and not rig.controller.load_queue
    with pytest.raises(ValueError, match="unqueue_load"):
        rig.controller.unqueue_load(1)


def test_every_outside_call_is_checked_unless_marked_trusted():
    """``trusted`` is keyword-only and off by default: a positional fourth argument or none
    keeps every check."""
    rig = make_rig()
    slots = rig.allocator.alloc(2)
    with pytest.raises(TypeError, match="positional"):
        rig.controller.write(slots, 3, None, True)
    with pytest.raises(TypeError, match="node_id"):
        rig.controller.load(rig.host_pool.alloc(2), "3")
