"""HiCacheController.drain(): issue the queued writes, then wait for every issued transfer."""

from __future__ import annotations

import pytest
import torch

from hicache.controller import HiCacheAck, pop_finished_acks
from tests.controller.helpers import Rig, make_rig, poison, read_bytes


class SlowEvent:
    """A finish event still in flight until someone synchronizes on it (CPU events never are)."""

    def __init__(self) -> None:
        self.synchronized = False

    def query(self) -> bool:
        return self.synchronized

    def synchronize(self) -> None:
        self.synchronized = True


def in_flight(queue: list[HiCacheAck]) -> None:
    """Give every ack of ``queue`` a finish event that has not landed yet."""
    queue[:] = [ack._replace(finish_event=SlowEvent()) for ack in queue]


def busy_rig(page_size: int = 2) -> tuple[Rig, torch.Tensor, torch.Tensor]:
    """One write and one load issued and in flight, one write and one load queued; returns the
    rig, the queued load's device slots and the queued write's host slots."""
    rig = make_rig(page_size=page_size, pages=8)
    ctrl = rig.controller
    first, second = rig.allocator.alloc(page_size), rig.allocator.alloc(page_size)
    host = ctrl.write(first, node_id=1)
    ctrl.start_writing()
    ctrl.load(host, node_id=2)
    ctrl.start_loading()
    in_flight(ctrl.ack_write_queue)
    in_flight(ctrl.ack_load_queue)
    queued_host = ctrl.write(second, node_id=3)
    queued_device = ctrl.load(host, node_id=4)
    assert queued_host is not None and queued_device is not None
    return rig, queued_device, queued_host


def test_drain_issues_queued_writes_and_waits_for_every_ack() -> None:
    rig, _, _ = busy_rig()
    ctrl = rig.controller
    assert not pop_finished_acks(list(ctrl.ack_write_queue))
    ctrl.drain()
    assert ctrl.write_queue == []
    assert [ack.node_ids for ack in ctrl.ack_write_queue] == [[1], [3]]
    assert all(ack.finish_event.query() for ack in ctrl.ack_write_queue + ctrl.ack_load_queue)
    assert len(pop_finished_acks(ctrl.ack_write_queue)) == 2 and not ctrl.ack_write_queue
    assert len(pop_finished_acks(ctrl.ack_load_queue)) == 1 and not ctrl.ack_load_queue


def test_drain_does_not_issue_queued_loads() -> None:
    rig, queued_device, _ = busy_rig()
    ctrl = rig.controller
    poison(rig.device_pool)
    producer = ctrl.layer_done_counter.producer_index
    ctrl.drain()
    assert [op.node_ids for op in ctrl.load_queue] == [[4]]
    assert [ack.node_ids for ack in ctrl.ack_load_queue] == [[2]]
    assert ctrl.layer_done_counter.producer_index == producer
    assert all((layer == 0xAB).all() for layer in read_bytes(rig.device_pool, queued_device))


def test_drain_on_an_idle_controller_is_a_no_op() -> None:
    rig = make_rig()
    ctrl = rig.controller
    free = (rig.allocator.available_size(), rig.host_pool.available_size())
    ctrl.drain()
    assert ctrl.write_queue == [] and ctrl.load_queue == []
    assert ctrl.ack_write_queue == [] and ctrl.ack_load_queue == []
    assert (rig.allocator.available_size(), rig.host_pool.available_size()) == free


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_drain_lands_every_transfer() -> None:
    rig = make_rig(page_size=64, pages=16, device="cuda", layers=8, heads=8, dim=128)
    ctrl = rig.controller
    slots = rig.allocator.alloc(256)
    host = ctrl.write(slots, node_id=1)
    ctrl.start_writing()
    ctrl.load(host, node_id=2)
    ctrl.start_loading()
    ctrl.write(rig.allocator.alloc(64), node_id=3)
    ctrl.drain()
    assert all(ack.finish_event.query() for ack in ctrl.ack_write_queue + ctrl.ack_load_queue)
