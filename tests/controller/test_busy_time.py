"""The controller's transfer durations are the transfer stream's busy time, not dispatch time:
a load whose later layers are issued as the forward pass reaches them (``layers_ahead``) counts
only the spans that issued layers, never the time between them; on CUDA they come from timing
events on the load stream, resolved without blocking."""

from __future__ import annotations

import time

import pytest
import torch

from hicache.controller.stats import BatchClock
from tests.controller.helpers import fill_random, make_rig

GAP_S = 0.05  # the CPU's pause between two reaches of a deferred load


def test_a_batch_clock_sums_its_spans_and_skips_the_gaps() -> None:
    clock = BatchClock(cuda=False)
    clock.resume()
    clock.resume()  # a no-op while open
    time.sleep(0.01)
    clock.pause()
    time.sleep(GAP_S)  # not a span
    clock.pause()  # a no-op while closed
    clock.resume()
    clock.pause()
    assert clock.landed()
    assert 0.01 <= clock.elapsed() < GAP_S


def deferred_load(device: str, layers: int) -> tuple[object, float]:
    """A backed-up page loaded back with ``layers_ahead=1`` and the forward's reaches
    ``GAP_S`` apart; (the controller, the wall time from start_loading to the last reach)."""
    rig = make_rig(device=device, layers=layers, layers_ahead=1, heads=8, dim=128, pages=64)
    ctrl = rig.controller
    slots = rig.allocator.alloc(16)
    fill_random(rig.device_pool, slots, seed=1)
    host = ctrl.write(slots, node_id=1)
    ctrl.drain()
    loaded = ctrl.load(host, node_id=2)
    assert loaded is not None
    t0 = time.perf_counter()
    producer = ctrl.start_loading()
    ctrl.layer_done_counter.set_consumer(producer)
    for layer in range(layers):
        time.sleep(GAP_S)
        rig.device_pool.get_key_buffer(layer)  # issues through layer + 1
    wall = time.perf_counter() - t0
    ctrl.drain()
    return ctrl, wall


def test_a_deferred_load_counts_its_issues_not_the_gaps() -> None:
    ctrl, wall = deferred_load("cpu", layers=4)
    stats = ctrl.stats()
    assert stats.load_batches == 1 and stats.h2d_batch_seconds.count == 1
    assert wall > 4 * GAP_S
    assert 0 < stats.h2d_seconds < GAP_S  # three gaps of GAP_S lie inside the batch's issue


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_durations_come_from_stream_events_without_a_sync() -> None:
    deferred_load("cuda", layers=4)  # warm: the first launches compile their kernels, and a
    # span holding a compile counts it (the stream idles between the span's events meanwhile)
    ctrl, wall = deferred_load("cuda", layers=4)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        stats = ctrl.stats()  # resolves the landed batches' events: no sync
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert stats.h2d_batch_seconds.count == 1 and stats.d2h_batch_seconds.count == 1
    assert wall > 4 * GAP_S and 0 < stats.h2d_seconds < GAP_S
    assert 0 < stats.d2h_seconds < GAP_S


def test_a_cpu_write_batch_is_timed_in_one_span_and_acked_done() -> None:
    rig = make_rig(pages=8)
    ctrl = rig.controller
    slots = rig.allocator.alloc(4)
    fill_random(rig.device_pool, slots, seed=2)
    clock = ctrl.counters.d2h.begin_span()
    assert isinstance(clock, float)  # on CPU a start time, no clock object
    for node_id in (1, 2):
        assert ctrl.write(slots[2 * (node_id - 1) : 2 * node_id], node_id=node_id) is not None
    ctrl.start_writing()  # both writes in one batch, copied at once on CPU
    (ack,) = ctrl.ack_write_queue
    assert ack.node_ids == [1, 2] and ack.start_event.query() and ack.finish_event.query()
    stats = ctrl.stats()
    assert stats.write_batches == 1 and stats.d2h_batch_seconds.count == 1
    assert stats.d2h_bytes == 4 * rig.host_pool.slot_bytes and stats.d2h_seconds > 0
    ctrl.counters.d2h.end(clock, 0)  # a span of no tokens: a batch, its wall time
    after = ctrl.stats()
    assert after.write_batches == 2 and after.d2h_batch_seconds.count == 2
    assert after.d2h_seconds > stats.d2h_seconds and after.d2h_bytes == stats.d2h_bytes
