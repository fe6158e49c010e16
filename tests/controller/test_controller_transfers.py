"""HiCacheController write/load round trips through the real pools, every route, on CPU."""

from __future__ import annotations

import threading

import pytest
import torch

from hicache.controller import HiCacheAck, LayerLoadingEvent, pop_finished_acks
from hicache.controller.operations import CacheOperation
from hicache.pools import ROUTES
from hicache.pools.load_plan import LoadPlan
from tests.controller.helpers import (
    assert_same_bytes,
    fill_random,
    make_rig,
    poison,
    read_bytes,
)


def offload(rig, device_indices: torch.Tensor, node_id: int) -> torch.Tensor:
    host_indices = rig.controller.write(device_indices, node_id)
    assert host_indices is not None
    rig.controller.start_writing()
    return host_indices


@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize(("kind", "io_backend", "layout"), ROUTES)
def test_write_then_load_is_byte_exact(kind: str, io_backend: str, layout: str, page_size: int):
    rig = make_rig(kind, io_backend, layout, page_size)
    ctrl = rig.controller
    first = rig.allocator.alloc(2 * page_size)
    fill_random(rig.device_pool, first, seed=1)
    want = read_bytes(rig.device_pool, first)
    host_indices = offload(rig, first, node_id=11)
    assert ctrl.evict_device(first) == first.numel()
    poison(rig.device_pool)
    device_indices = ctrl.load(host_indices, node_id=12)
    assert device_indices is not None
    producer = ctrl.start_loading()
    ctrl.layer_done_counter.set_consumer(producer)
    assert_same_bytes(read_bytes(rig.device_pool, device_indices), want)


@pytest.mark.parametrize(("kind", "io_backend", "layout"), ROUTES)
def test_queued_writes_and_loads_merge_into_one_batch(kind: str, io_backend: str, layout: str):
    page_size = 4
    rig = make_rig(kind, io_backend, layout, page_size, pages=6)
    ctrl = rig.controller
    nodes = {nid: rig.allocator.alloc(n * page_size) for nid, n in ((1, 1), (2, 2), (3, 1))}
    for seed, slots in nodes.items():
        fill_random(rig.device_pool, slots, seed=seed)
    want = {nid: read_bytes(rig.device_pool, slots) for nid, slots in nodes.items()}
    host = {nid: ctrl.write(slots, nid) for nid, slots in nodes.items()}
    assert len(ctrl.write_queue) == 3
    ctrl.start_writing()
    assert ctrl.write_queue == [] and [a.node_ids for a in ctrl.ack_write_queue] == [[1, 2, 3]]
    for slots in nodes.values():
        ctrl.evict_device(slots)
    poison(rig.device_pool)
    loaded = {nid: ctrl.load(host[nid], nid + 10) for nid in (3, 1, 2)}
    merged = CacheOperation.merge(ctrl.load_queue)  # what start_loading issues
    if io_backend != "kernel":  # plans (direct) or counts runs (auto) on the CPU: the CPU copy
        assert torch.equal(merged.device_indices_cpu, merged.device_indices.cpu())
    else:
        assert merged.device_indices_cpu is None
    assert ctrl.start_loading() == 0
    assert ctrl.load_queue == [] and [a.node_ids for a in ctrl.ack_load_queue] == [[13, 11, 12]]
    ctrl.layer_done_counter.set_consumer(0)
    for nid, slots in loaded.items():
        assert_same_bytes(read_bytes(rig.device_pool, slots), want[nid])


def test_acks_carry_node_ids_and_complete():
    rig = make_rig()
    ctrl = rig.controller
    slots = rig.allocator.alloc(2)
    offload(rig, slots, node_id=5)
    (ack,) = ctrl.ack_write_queue
    assert isinstance(ack, HiCacheAck)
    assert ack.node_ids == [5]
    assert ack.start_event.query() and ack.finish_event.query()
    assert pop_finished_acks(ctrl.ack_write_queue) == [ack]
    assert ctrl.ack_write_queue == []


def test_empty_queues_issue_nothing():
    rig = make_rig()
    ctrl = rig.controller
    ctrl.start_writing()
    assert ctrl.start_loading() == -1
    assert ctrl.ack_write_queue == [] and ctrl.ack_load_queue == []
    assert ctrl.layer_done_counter.producer_index == -1


def test_load_batches_cycle_through_the_ring_with_their_own_events():
    rig = make_rig(pages=8)
    ctrl = rig.controller
    host_indices = offload(rig, rig.allocator.alloc(1), node_id=0)
    producers = []
    for node_id in range(4):
        assert ctrl.load(host_indices, node_id) is not None
        producers.append(ctrl.start_loading())
    assert producers == [0, 1, 2, 0]
    assert [a.node_ids for a in ctrl.ack_load_queue] == [[0], [1], [2], [3]]
    assert len({id(a.finish_event) for a in ctrl.ack_load_queue}) == 4
    assert ctrl.ack_load_queue[-1].finish_event is ctrl.layer_done_counter.events[0].finish_event


def test_load_issues_each_layer_then_records_its_event(monkeypatch):
    rig = make_rig(layers=3)
    ctrl = rig.controller
    host_indices = offload(rig, rig.allocator.alloc(1), node_id=0)
    calls: list[tuple[str, int]] = []
    real_run = LoadPlan.run

    def spy_run(plan, layer_id):
        calls.append(("load", layer_id))
        real_run(plan, layer_id)

    monkeypatch.setattr(LoadPlan, "run", spy_run)
    monkeypatch.setattr(
        LayerLoadingEvent,
        "complete",
        lambda self, layer, stream=None: calls.append(("done", layer)),
    )
    ctrl.load(host_indices, node_id=1)
    ctrl.start_loading()
    assert calls == [(step, layer) for layer in range(3) for step in ("load", "done")]


def test_load_cache_event_is_set_when_a_batch_is_issued():
    flag = threading.Event()
    rig = make_rig(load_cache_event=flag)
    ctrl = rig.controller
    host_indices = offload(rig, rig.allocator.alloc(1), node_id=0)
    assert ctrl.start_loading() == -1 and not flag.is_set()
    ctrl.load(host_indices, node_id=1)
    ctrl.start_loading()
    assert flag.is_set()


def test_controller_wires_the_counter_into_the_device_pool():
    rig = make_rig(layers=5)
    ctrl = rig.controller
    assert rig.device_pool.layer_transfer_counter is ctrl.layer_done_counter
    assert ctrl.layer_done_counter.num_layers == 5
    assert ctrl.mem_pool_device is rig.device_pool
    assert ctrl.write_stream is None and ctrl.load_stream is None
    assert (ctrl.write_policy, ctrl.io_backend, ctrl.page_size) == ("write_through", "kernel", 1)


def test_merged_operation_keeps_a_cpu_copy_only_when_every_part_has_one():
    dev = [torch.tensor([4, 5]), torch.tensor([8, 9])]
    with_cpu = [CacheOperation(torch.tensor([0, 1]), d, [i], d.clone()) for i, d in enumerate(dev)]
    merged = CacheOperation.merge(with_cpu)
    assert merged.device_indices_cpu.tolist() == [4, 5, 8, 9] and merged.node_ids == [0, 1]
    partial = [with_cpu[0], CacheOperation(torch.tensor([2, 3]), dev[1], [1])]
    assert CacheOperation.merge(partial).device_indices_cpu is None


def test_a_load_batch_is_checked_and_planned_once(monkeypatch):
    """start_loading plans the batch once: the index checks run once, not once per layer."""
    import hicache.pools.host_pool as host_pool_module

    rig = make_rig(layers=3)
    ctrl = rig.controller
    host_indices = offload(rig, rig.allocator.alloc(2), node_id=0)
    checked: list[str] = []
    real_check = host_pool_module.check_slot_indices
    monkeypatch.setattr(
        host_pool_module,
        "check_slot_indices",
        lambda name, *a: checked.append(name) or real_check(name, *a),
    )
    real_plan = rig.host_pool.plan_load
    plans: list[object] = []
    monkeypatch.setattr(rig.host_pool, "plan_load", lambda *a: plans.append(a) or real_plan(*a))
    ctrl.load(host_indices, node_id=1)
    ctrl.start_loading()
    assert len(plans) == 1
    assert checked == ["host_indices", "device_indices"]


@pytest.mark.parametrize(("kind", "io_backend", "layout"), ROUTES)
def test_trusted_calls_move_the_same_bytes(kind: str, io_backend: str, layout: str):
    """The cache's own calls (``trusted=True``: its tree's and pools' slots, unchecked) queue
    and move exactly what the checked calls do."""
    rig = make_rig(kind, io_backend, layout, 4)
    ctrl = rig.controller
    first = rig.allocator.alloc(8)
    fill_random(rig.device_pool, first, seed=5)
    want = read_bytes(rig.device_pool, first)
    host = rig.host_pool.alloc(8)
    assert torch.equal(ctrl.write(first, 21, host, trusted=True), host)
    ctrl.start_writing()
    ctrl.evict_device(first)
    poison(rig.device_pool)
    back = ctrl.load(host, 22, trusted=True)
    assert back is not None and len(ctrl.load_queue) == 1
    ctrl.start_loading()
    assert_same_bytes(read_bytes(rig.device_pool, back), want)
