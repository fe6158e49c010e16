"""``layers_ahead``: a load batch's later layers are issued as the forward pass reaches them,
and by anything that waits for the batch; never seen finished before they are issued."""

from __future__ import annotations

import pytest
import torch

from hicache.controller import HiCacheController
from hicache.controller.layer_done import RING_SIZE
from hicache.controller.layer_issue import DeferredFinish
from hicache.pools import ROUTES
from hicache.pools.load_plan import LoadPlan
from hicache.radix import HiCacheConfig
from tests.controller.helpers import fill_random, make_rig, poison

LAYERS = 6


def raw_layers(device_pool, indices: torch.Tensor) -> list[torch.Tensor]:
    """Every layer's bytes at ``indices`` read straight from the buffers (no counter wait)."""
    return [
        torch.cat([part[layer].view(torch.uint8)[indices] for part in device_pool.part_buffers], -1)
        for layer in range(device_pool.layer_num)
    ]


def loaded_layers(rig, want: list[torch.Tensor], slots: torch.Tensor) -> list[int]:
    """The layers whose bytes at ``slots`` are the backed-up ones."""
    got = raw_layers(rig.device_pool, slots)
    return [layer for layer in range(LAYERS) if torch.equal(got[layer], want[layer])]


def deferred_load(ahead: int, route=("mha", "kernel", "layer_first"), page_size: int = 1):
    """A rig whose controller has ``layers_ahead=ahead``, one node backed up, its device copy
    poisoned and a load of it issued: (rig, the backed-up bytes, the new slots, producer)."""
    kind, io_backend, layout = route
    rig = make_rig(kind, io_backend, layout, page_size, layers=LAYERS, layers_ahead=ahead)
    ctrl = rig.controller
    first = rig.allocator.alloc(2 * page_size)
    fill_random(rig.device_pool, first, seed=3)
    want = raw_layers(rig.device_pool, first)
    host = ctrl.write(first, node_id=1)
    ctrl.start_writing()
    ctrl.evict_device(first)
    poison(rig.device_pool)
    slots = ctrl.load(host, node_id=2)
    assert slots is not None
    return rig, want, slots, ctrl.start_loading()


@pytest.mark.parametrize(("kind", "io_backend", "layout"), ROUTES)
def test_the_forward_pass_issues_each_layer_before_it_reads_it(kind, io_backend, layout):
    rig, want, slots, producer = deferred_load(2, (kind, io_backend, layout), page_size=4)
    counter = rig.controller.layer_done_counter
    assert loaded_layers(rig, want, slots) == [0, 1]
    ack = rig.controller.ack_load_queue[-1]
    assert isinstance(ack.finish_event, DeferredFinish) and not ack.finish_event.query()
    counter.set_consumer(producer)
    for layer in range(LAYERS):
        rig.device_pool.get_key_buffer(layer)  # waits for the layer: issues through layer + 2
        assert loaded_layers(rig, want, slots) == list(range(min(layer + 3, LAYERS)))
    assert ack.finish_event.query()
    assert rig.controller.stats().load_batches == 1


@pytest.mark.parametrize(
    "settle",
    [
        lambda ctrl, ack: ctrl.start_writing(),
        lambda ctrl, ack: ctrl.start_loading(),
        lambda ctrl, ack: ctrl.drain(),
        lambda ctrl, ack: ctrl.reset(),
        lambda ctrl, ack: ctrl.issue_pending(),
        lambda ctrl, ack: ack.finish_event.synchronize(),
        lambda ctrl, ack: ack.finish_event.wait(),
    ],
    ids=["start_writing", "start_loading", "drain", "reset", "issue_pending", "sync", "wait"],
)
def test_whatever_waits_for_the_batch_issues_the_rest_first(settle):
    rig, want, slots, _ = deferred_load(1)
    ctrl = rig.controller
    ack = ctrl.ack_load_queue[-1]
    assert loaded_layers(rig, want, slots) == [0]
    settle(ctrl, ack)
    assert loaded_layers(rig, want, slots) == list(range(LAYERS))
    assert ack.finish_event.query()


def test_a_skipped_wait_still_issues_the_layer():
    rig, want, slots, producer = deferred_load(1)
    counter = rig.controller.layer_done_counter
    counter.set_consumer(producer)
    counter.skip_wait_for_testing = True
    counter.wait_until(3)
    assert loaded_layers(rig, want, slots) == [0, 1, 2, 3, 4]


def test_a_consumer_of_nothing_issues_nothing():
    rig, want, slots, _ = deferred_load(1)
    rig.controller.layer_done_counter.wait_until(4)  # no consumer set
    assert loaded_layers(rig, want, slots) == [0]


def test_a_batch_issued_whole_is_not_deferred():
    rig, want, slots, producer = deferred_load(LAYERS)
    batch = rig.controller.layer_done_counter.events[producer]
    assert loaded_layers(rig, want, slots) == list(range(LAYERS))
    assert batch.issue is None and not isinstance(batch.finish_event, DeferredFinish)


def test_a_layer_that_fails_is_retried_by_the_next_wait(monkeypatch):
    rig, want, slots, producer = deferred_load(1)
    counter = rig.controller.layer_done_counter
    counter.set_consumer(producer)
    issue = counter.events[producer].issue
    assert issue is not None
    real = LoadPlan.run
    failed: list[int] = []

    def flaky(plan, layer):
        if layer == 2 and not failed:
            failed.append(layer)
            raise RuntimeError("launch failed")
        real(plan, layer)

    monkeypatch.setattr(LoadPlan, "run", flaky)
    with pytest.raises(RuntimeError, match="launch failed"):
        counter.wait_until(2)
    assert loaded_layers(rig, want, slots) == [0, 1] and issue.issued == 2
    counter.wait_until(5)
    assert loaded_layers(rig, want, slots) == list(range(LAYERS))


@pytest.mark.parametrize(
    ("value", "error"),
    [(0, ValueError), (-1, ValueError), (True, TypeError), ("2", TypeError), (1.0, TypeError)],
)
def test_layers_ahead_is_checked(value, error):
    with pytest.raises(error, match="layers_ahead"):
        make_rig(layers_ahead=value)
    with pytest.raises(error, match="layers_ahead"):
        HiCacheConfig(layers_ahead=value)


def test_the_default_issues_every_layer_up_front():
    rig = make_rig(layers=LAYERS)
    assert isinstance(rig.controller, HiCacheController)
    first = rig.allocator.alloc(1)
    host = rig.controller.write(first, node_id=1)
    rig.controller.start_writing()
    assert rig.controller.load(host, node_id=2) is not None
    rig.controller.start_loading()
    assert rig.controller.ack_load_queue[-1].finish_event.query()
    assert not isinstance(rig.controller.ack_load_queue[-1].finish_event, DeferredFinish)


def test_done_tells_whether_every_layer_is_issued():
    rig, _, _, producer = deferred_load(2)
    issue = rig.controller.layer_done_counter.events[producer].issue
    assert issue is not None and not issue.done
    issue.through(LAYERS - 2)
    assert issue.issued == LAYERS - 1 and not issue.done
    issue.finish()
    assert issue.done


def test_a_slot_taken_after_a_deferred_batch_starts_plain():
    rig, _, _, producer = deferred_load(1)
    counter = rig.controller.layer_done_counter
    old = counter.events[producer]
    old.finish_event.synchronize()  # issues the rest
    for _ in range(RING_SIZE):  # back to the deferred batch's slot
        index = counter.update_producer()
    assert index == producer
    new = counter.events[index]
    assert new.issue is None and not isinstance(new.finish_event, DeferredFinish)
    assert (new.num_layers, new.device, new.load_events) == (LAYERS, old.device, old.load_events)
