"""LayerDoneCounter ring semantics on CPU (events are completed no-ops there)."""

from __future__ import annotations

import pytest

from hicache.controller import NO_CONSUMER, LayerDoneCounter, LayerLoadingEvent
from hicache.controller.layer_done import RING_SIZE


class PendingEvent:
    """An event that never completes: stands in for a CUDA event of a batch still in flight."""

    def record(self, stream: object = None) -> None:
        return None

    def wait(self, stream: object = None) -> None:
        return None

    def query(self) -> bool:
        return False

    def synchronize(self) -> None:
        raise AssertionError("a test event cannot be waited for")


class SpyEvent(PendingEvent):
    def __init__(self) -> None:
        self.waits = 0

    def query(self) -> bool:
        return True

    def wait(self, stream: object = None) -> None:
        self.waits += 1


def cpu_counter(num_layers: int = 4) -> LayerDoneCounter:
    return LayerDoneCounter(num_layers, device="cpu")


def test_producer_cycles_through_the_ring() -> None:
    counter = cpu_counter()
    assert counter.producer_index == -1
    assert [counter.update_producer() for _ in range(2 * RING_SIZE)] == [0, 1, 2, 0, 1, 2]
    assert counter.producer_index == 2


def test_next_producer_is_a_query() -> None:
    counter = cpu_counter()
    assert counter.next_producer == 0
    assert counter.next_producer == 0
    counter.update_producer()
    assert counter.next_producer == 1


def test_each_batch_gets_fresh_events() -> None:
    counter = cpu_counter(num_layers=3)
    old = counter.events[0]
    index = counter.update_producer()
    assert index == 0
    assert counter.events[0] is not old
    assert len(counter.events[0].load_events) == 3


def test_reusing_an_unfinished_slot_raises_and_changes_nothing() -> None:
    counter = cpu_counter()
    counter.update_producer()
    counter.update_producer()
    counter.update_producer()
    counter.events[0].finish_event = PendingEvent()
    with pytest.raises(RuntimeError, match="slot 0"):
        counter.update_producer()
    assert counter.producer_index == 2
    assert counter.next_producer == 0


class LandsWhenWaited(PendingEvent):
    def __init__(self) -> None:
        self.landed = False

    def query(self) -> bool:
        return self.landed


def test_an_unfinished_slot_is_waited_for_through_the_callback() -> None:
    counter = cpu_counter()
    for _ in range(RING_SIZE):
        counter.update_producer()
    oldest = counter.events[0].finish_event = LandsWhenWaited()
    waited: list[object] = []

    def wait(event: object) -> None:
        waited.append(event)
        oldest.landed = True

    assert counter.update_producer(wait) == 0 and waited == [oldest]
    assert counter.events[0].finish_event is not oldest


def test_a_wait_that_does_not_land_the_batch_raises_and_changes_nothing() -> None:
    counter = cpu_counter()
    for _ in range(RING_SIZE):
        counter.update_producer()
    counter.events[0].finish_event = LandsWhenWaited()
    with pytest.raises(RuntimeError, match="slot 0"):
        counter.update_producer(lambda event: None)
    assert counter.producer_index == 2


def test_an_unfinished_slot_ahead_blocks_even_after_reset() -> None:
    counter = cpu_counter()
    counter.update_producer()
    counter.events[0].finish_event = PendingEvent()
    counter.reset()
    with pytest.raises(RuntimeError):
        counter.update_producer()


def test_set_consumer_accepts_produced_slots_and_minus_one() -> None:
    counter = cpu_counter()
    first = counter.update_producer()
    counter.set_consumer(first)
    assert counter.consumer_index == first
    counter.set_consumer(NO_CONSUMER)
    assert counter.consumer_index == NO_CONSUMER


@pytest.mark.parametrize("bad", [1, 2, 3, -2, 100])
def test_set_consumer_rejects_unproduced_slot_state_unchanged(bad: int) -> None:
    counter = cpu_counter()
    counter.set_consumer(counter.update_producer())
    with pytest.raises(ValueError, match="set_consumer"):
        counter.set_consumer(bad)
    assert counter.consumer_index == 0


@pytest.mark.parametrize("bad", [None, 1.0, "0", True])
def test_set_consumer_rejects_non_int(bad: object) -> None:
    counter = cpu_counter()
    counter.update_producer()
    with pytest.raises(TypeError):
        counter.set_consumer(bad)  # type: ignore[arg-type]
    assert counter.consumer_index == NO_CONSUMER


def test_wait_until_returns_at_once_on_cpu() -> None:
    counter = cpu_counter(num_layers=2)
    counter.wait_until(0)
    counter.set_consumer(counter.update_producer())
    counter.wait_until(0)
    counter.wait_until(1)


@pytest.mark.parametrize("layer", [-1, 4, 100])
def test_wait_until_validates_layer(layer: int) -> None:
    counter = cpu_counter(num_layers=4)
    with pytest.raises(ValueError, match="layer"):
        counter.wait_until(layer)


def test_wait_until_waits_on_the_consumer_batch_layer_only() -> None:
    counter = cpu_counter(num_layers=3)
    counter.update_producer()
    counter.set_consumer(counter.update_producer())
    spies = [SpyEvent() for _ in range(3)]
    counter.events[1].load_events = list(spies)
    counter.wait_until(2)
    counter.wait_until(2)
    counter.wait_until(0)
    assert [spy.waits for spy in spies] == [1, 0, 2]


def test_no_consumer_and_skip_switch_do_not_wait() -> None:
    counter = cpu_counter(num_layers=1)
    counter.set_consumer(counter.update_producer())
    spy = SpyEvent()
    counter.events[0].load_events = [spy]
    counter.skip_wait_for_testing = True
    counter.wait_until(0)
    counter.skip_wait_for_testing = False
    counter.set_consumer(NO_CONSUMER)
    counter.wait_until(0)
    assert spy.waits == 0


def test_reset_forgets_producer_and_consumer() -> None:
    counter = cpu_counter()
    counter.update_producer()
    counter.set_consumer(counter.update_producer())
    counter.reset()
    assert counter.producer_index == -1
    assert counter.consumer_index == NO_CONSUMER
    with pytest.raises(ValueError):
        counter.set_consumer(1)
    assert counter.update_producer() == 0


@pytest.mark.parametrize("bad", [0, -1])
def test_num_layers_must_be_positive(bad: int) -> None:
    with pytest.raises(ValueError, match="num_layers"):
        LayerDoneCounter(bad, device="cpu")


def test_num_layers_must_be_int() -> None:
    with pytest.raises(TypeError, match="num_layers"):
        LayerDoneCounter(2.0, device="cpu")  # type: ignore[arg-type]


def test_layer_loading_event_on_cpu_is_complete() -> None:
    batch = LayerLoadingEvent(2, "cpu")
    batch.start_event.record()
    batch.complete(0)
    batch.complete(1)
    batch.wait(1)
    batch.finish_event.record()
    assert batch.finish_event.query()
    assert all(event.query() for event in batch.load_events)


def test_a_slot_taken_again_gets_new_batch_events_and_its_layer_events_back() -> None:
    counter = cpu_counter(num_layers=2)
    first = counter.events[counter.update_producer()]
    for _ in range(RING_SIZE - 1):
        counter.update_producer()
    again = counter.events[counter.update_producer()]
    assert again is not first
    assert again.load_events is first.load_events  # recorded again, not created again
    assert again.start_event is not first.start_event
    assert again.finish_event is not first.finish_event
