"""CUDA-only: streams, per-layer waits and stale reads. Skipped without a GPU.

The loads are large (``TOKENS`` tokens x ``LAYERS`` layers x 8 KiB per token and layer, ~1 GiB
per batch) and go through the transfer kernels with their default ``block_quota=2``, so a batch
takes milliseconds per layer: when the forward pass consumes layer 0, later layers are still in
flight. ``torch.cuda._sleep`` on a stream stands in for a busy stream where a test needs the
ordering to be deterministic.
"""

from __future__ import annotations

import pytest
import torch

from hicache.controller import LayerDoneCounter, pop_finished_acks
from tests.controller.helpers import Rig, fill_random, make_rig, poison, read_bytes, read_layer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TOKENS = 16384
LAYERS = 8
PAGE_SIZE = 64
SLEEP_CYCLES = 100_000_000  # ~50 ms at H200 clocks
TRIES = 4
GPU_ROUTES = [
    ("kernel", "layer_first"),
    ("kernel", "page_first"),
    ("direct", "page_first_direct"),
    ("auto", "layer_first"),  # 256 KiB page runs: the copy engines
]


def big_rig(
    io_backend: str = "kernel", layout: str = "layer_first", layers_ahead: int | None = None
) -> Rig:
    """MHA fp32, 8 heads x 128: 4 KiB of K and 4 KiB of V per token per layer."""
    return make_rig(
        "mha", io_backend, layout, PAGE_SIZE, TOKENS // PAGE_SIZE,
        device="cuda", layers=LAYERS, heads=8, dim=128, layers_ahead=layers_ahead,
    )  # fmt: skip


def offloaded(rig: Rig) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Fill TOKENS device slots, back them up, free them: (host indices, expected bytes)."""
    ctrl = rig.controller
    slots = rig.allocator.alloc(TOKENS)
    fill_random(rig.device_pool, slots, seed=0)
    want = read_bytes(rig.device_pool, slots)
    host_indices = ctrl.write(slots, node_id=1)
    ctrl.drain()  # a direct write may wait for its indices to reach the CPU: drain issues it
    assert len(pop_finished_acks(ctrl.ack_write_queue)) == 1
    ctrl.evict_device(slots)
    warm_up_loads(rig, host_indices[:PAGE_SIZE])
    return host_indices, want


def warm_up_loads(rig: Rig, host_indices: torch.Tensor) -> None:
    """One small load so kernel compilation does not happen inside a timed trial."""
    device_indices = rig.controller.load(host_indices, node_id=0)
    rig.controller.start_loading()
    finish_trial(rig, device_indices)


def delay(stream: torch.cuda.Stream | None) -> None:
    with torch.cuda.stream(stream):
        torch.cuda._sleep(SLEEP_CYCLES)


def finish_trial(rig: Rig, device_indices: torch.Tensor) -> None:
    rig.controller.issue_pending()  # layers no read issued (layers_ahead), as the next step would
    torch.cuda.synchronize()
    rig.controller.layer_done_counter.set_consumer(-1)
    assert len(pop_finished_acks(rig.controller.ack_load_queue)) == 1
    rig.controller.evict_device(device_indices)


@pytest.mark.parametrize("layers_ahead", [None, 1], ids=["whole", "ahead1"])
@pytest.mark.parametrize("delay_load_stream", [False, True])
@pytest.mark.parametrize(("io_backend", "layout"), GPU_ROUTES)
def test_reading_layer_after_its_wait_sees_loaded_bytes(
    io_backend, layout, delay_load_stream, layers_ahead
):
    """Also with the later layers issued by the reads themselves (``layers_ahead``)."""
    rig = big_rig(io_backend, layout, layers_ahead)
    ctrl = rig.controller
    host_indices, want = offloaded(rig)
    in_flight = 0
    for _ in range(TRIES):
        poison(rig.device_pool)
        device_indices = ctrl.load(host_indices, node_id=2)
        if delay_load_stream:
            delay(ctrl.load_stream)
        producer = ctrl.start_loading()
        ctrl.layer_done_counter.set_consumer(producer)
        got = [read_layer(rig.device_pool, 0, device_indices)]
        passed_layer0 = torch.cuda.Event()
        passed_layer0.record()
        got += [read_layer(rig.device_pool, lay, device_indices) for lay in range(1, LAYERS)]
        passed_layer0.synchronize()
        in_flight += not ctrl.layer_done_counter.events[producer].load_events[-1].query()
        finish_trial(rig, device_indices)
        for layer in range(LAYERS):
            assert torch.equal(got[layer], want[layer]), f"layer {layer} read stale bytes"
    print(f"{io_backend}/{layout}: last layer in flight after layer 0 in {in_flight}/{TRIES}")
    if io_backend == "kernel":  # direct copies are issued from the CPU, which may lag the GPU
        assert in_flight > 0, "layer 0 was never consumed while the last layer was in flight"
    rig.host_pool.close()


def test_without_the_wait_stale_bytes_are_read():
    rig = big_rig()
    ctrl = rig.controller
    host_indices, want = offloaded(rig)
    ctrl.layer_done_counter.skip_wait_for_testing = True
    stale = 0
    for _ in range(TRIES):
        poison(rig.device_pool)
        device_indices = ctrl.load(host_indices, node_id=2)
        ctrl.layer_done_counter.set_consumer(ctrl.start_loading())
        last = read_layer(rig.device_pool, LAYERS - 1, device_indices)
        finish_trial(rig, device_indices)
        stale += not torch.equal(last, want[-1])
        landed = read_layer(rig.device_pool, LAYERS - 1, device_indices)
        assert torch.equal(landed, want[-1]), "the load itself must still land"
    print(f"stale reads without the wait: {stale}/{TRIES}")
    assert stale > 0, "removing the wait never exposed stale data: the test proves nothing"
    rig.host_pool.close()


def test_write_waits_for_the_compute_that_produced_the_kv():
    rig = big_rig()
    ctrl = rig.controller
    slots = rig.allocator.alloc(TOKENS)
    poison(rig.device_pool)
    delay(torch.cuda.current_stream())
    fill_random(rig.device_pool, slots, seed=3)
    host_indices = ctrl.write(slots, node_id=1)
    ctrl.start_writing()
    torch.cuda.synchronize()
    want = read_bytes(rig.device_pool, slots)
    ctrl.evict_device(slots)
    poison(rig.device_pool)
    device_indices = ctrl.load(host_indices, node_id=2)
    ctrl.layer_done_counter.set_consumer(ctrl.start_loading())
    got = read_bytes(rig.device_pool, device_indices)
    torch.cuda.synchronize()
    for layer in range(LAYERS):
        assert torch.equal(got[layer], want[layer]), f"layer {layer}: backup copied stale KV"
    rig.host_pool.close()


def test_reset_waits_for_transfers_in_flight():
    rig = big_rig()
    ctrl = rig.controller
    host_indices, _ = offloaded(rig)
    ctrl.load(host_indices, node_id=2)
    delay(ctrl.load_stream)
    producer = ctrl.start_loading()
    batch = ctrl.layer_done_counter.events[producer]
    assert not batch.finish_event.query(), "the delayed load should still be in flight"
    ctrl.reset()
    assert batch.finish_event.query()
    assert ctrl.ack_load_queue == [] and ctrl.layer_done_counter.producer_index == -1
    rig.host_pool.close()


def test_start_loading_waits_for_a_free_ring_slot_instead_of_reusing_a_busy_one():
    rig = big_rig()
    ctrl = rig.controller
    host_indices, _ = offloaded(rig)
    small = host_indices[: 4 * PAGE_SIZE]
    producers = []
    for node_id in range(4):
        ctrl.load(small, node_id)
        delay(ctrl.load_stream)
        producers.append(ctrl.start_loading())
    first = producers[0]  # earlier loads of the rig may have advanced the ring
    assert producers == [first, (first + 1) % 3, (first + 2) % 3, first]
    first_ack = ctrl.ack_load_queue[0]
    assert first_ack.finish_event.query(), "slot 0 was reused before its batch finished"
    torch.cuda.synchronize()
    rig.host_pool.close()


def test_counter_refuses_to_reuse_a_slot_in_flight():
    counter = LayerDoneCounter(2, device="cuda")
    stream = torch.cuda.Stream()
    first = counter.update_producer()
    delay(stream)
    counter.events[first].finish_event.record(stream)
    counter.update_producer()
    counter.update_producer()
    with pytest.raises(RuntimeError, match="in flight"):
        counter.update_producer()
    assert counter.producer_index == 2
    stream.synchronize()
    assert counter.update_producer() == 0


def test_direct_start_loading_does_not_wait_for_compute():
    """The direct backend plans on the CPU; loads carry the allocator's CPU copy of their slots,
    so issuing a load never waits for the compute stream (which a device-to-host copy would)."""
    rig = big_rig("direct", "page_first_direct")
    ctrl = rig.controller
    host_indices, want = offloaded(rig)
    poison(rig.device_pool)
    busy = torch.cuda.Event()
    with torch.cuda.stream(torch.cuda.current_stream()):
        torch.cuda._sleep(8 * SLEEP_CYCLES)  # ~400 ms of "forward pass"
        busy.record()
    device_indices = ctrl.load(host_indices, node_id=2)
    ctrl.layer_done_counter.set_consumer(ctrl.start_loading())
    assert not busy.query(), "start_loading waited for the compute stream"
    got = read_bytes(rig.device_pool, device_indices)
    finish_trial(rig, device_indices)
    for layer in range(LAYERS):
        assert torch.equal(got[layer], want[layer]), f"layer {layer} read stale bytes"
    rig.host_pool.close()


def test_load_stream_outranks_compute_and_writes():
    """A forward pass waits on the load stream's layers: its copy kernels must not queue behind
    the matmuls' blocks, so it has the device's highest priority; backups keep the lowest."""
    ctrl = big_rig().controller
    lowest = torch.cuda.current_stream().priority  # the default stream: priority 0, the lowest
    assert ctrl.load_stream.priority < lowest  # lower numbers run first
    assert ctrl.write_stream.priority == lowest


@pytest.mark.parametrize("layers_ahead", [None, 1], ids=["whole", "ahead1"])
@pytest.mark.parametrize(("io_backend", "layout"), GPU_ROUTES)
def test_writes_and_loads_never_synchronize_the_scheduler(io_backend, layout, layers_ahead):
    """With a backup of another node in flight, queueing and issuing a write and a load (and
    polling until the write is issued) makes no device-to-CPU synchronisation: CUDA's sync
    debug mode turns any into an error. The bytes then land where they should."""
    rig = big_rig(io_backend, layout, layers_ahead)
    ctrl = rig.controller
    host_indices, want = offloaded(rig)  # on the host, device slots freed
    first = rig.allocator.alloc(TOKENS // 4)
    fill_random(rig.device_pool, first, seed=1)
    second = rig.allocator.alloc(PAGE_SIZE * 4)
    fill_random(rig.device_pool, second, seed=2)
    want_second = read_bytes(rig.device_pool, second)
    ctrl.write(first, node_id=3)
    ctrl.drain()  # warm up the copy path (first use may pin or load the runtime)
    pop_finished_acks(ctrl.ack_write_queue)
    ctrl.write(first, node_id=4)  # a long backup, in flight from here on
    while ctrl.write_queue:  # a direct write is issued once its indices reached the CPU
        ctrl.start_writing()
    assert not ctrl.ack_write_queue[-1].finish_event.query(), "the backup was not in flight"
    torch.cuda.set_sync_debug_mode("error")
    try:
        second_host = ctrl.write(second, node_id=5)
        ctrl.start_writing()
        loaded = ctrl.load(host_indices[: TOKENS // 2], node_id=6)
        ctrl.layer_done_counter.set_consumer(ctrl.start_loading())
        for _ in range(10_000):
            if not ctrl.write_queue:
                break
            ctrl.start_writing()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert not ctrl.write_queue, "the write was never issued"
    got = read_bytes(rig.device_pool, loaded)
    ctrl.drain()
    for layer in range(LAYERS):
        assert torch.equal(got[layer], want[layer][: TOKENS // 2]), f"layer {layer}: stale bytes"
    ctrl.evict_device(second)
    back = ctrl.load(second_host, node_id=7)
    ctrl.layer_done_counter.set_consumer(ctrl.start_loading())
    got_second = read_bytes(rig.device_pool, back)
    ctrl.drain()
    for layer in range(LAYERS):
        assert torch.equal(got_second[layer], want_second[layer]), f"layer {layer}: backup lost"
    rig.host_pool.close()
