"""Issue 12, LayerDoneCounter / LayerLoadingEvent arguments: no silent conversion.

``wait_until(0.5)`` and ``wait_until(True)`` were accepted (compared as numbers), and
``LayerLoadingEvent.complete(-1)`` recorded the last layer's event. Every public method now
raises ``TypeError`` / ``ValueError`` naming the argument, with the counter unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest

from hicache.controller import NO_CONSUMER, LayerDoneCounter, LayerLoadingEvent

NOT_INTS = [0.5, 1.0, True, False, "1", None, np.float64(1.0), [0]]


def state(counter: LayerDoneCounter) -> tuple[int, int, int]:
    return counter.producer_index, counter.consumer_index, counter.next_producer


@pytest.mark.parametrize("layer", NOT_INTS, ids=repr)
def test_wait_until_rejects_non_int_layers(layer):
    counter = LayerDoneCounter(4, "cpu")
    counter.set_consumer(counter.update_producer())
    before = state(counter)
    with pytest.raises(TypeError, match="wait_until: layer"):
        counter.wait_until(layer)
    assert state(counter) == before
    counter.wait_until(3)


@pytest.mark.parametrize("layer", [-1, 4, 2**40])
def test_wait_until_rejects_layers_out_of_range(layer):
    counter = LayerDoneCounter(4, "cpu")
    with pytest.raises(ValueError, match="wait_until: layer"):
        counter.wait_until(layer)


@pytest.mark.parametrize(
    ("index", "error"),
    [
        (True, TypeError),
        (0.0, TypeError),
        ("0", TypeError),
        (None, TypeError),
        (1, ValueError),
        (3, ValueError),
        (-2, ValueError),  # slots never produced
    ],
    ids=repr,
)
def test_set_consumer_rejects_bad_indices(index, error):
    counter = LayerDoneCounter(2, "cpu")
    counter.update_producer()
    with pytest.raises(error, match="index"):
        counter.set_consumer(index)
    assert counter.consumer_index == NO_CONSUMER


@pytest.mark.parametrize("method", ["complete", "wait"])
@pytest.mark.parametrize(
    "layer, exc", [(-1, ValueError), (3, ValueError), (True, TypeError), (0.0, TypeError)]
)
def test_loading_event_methods_check_the_layer(method, layer, exc):
    """``complete(-1)`` used to record the last layer's event (negative list indexing)."""
    event = LayerLoadingEvent(3, "cpu")
    with pytest.raises(exc, match=f"{method}: layer"):
        getattr(event, method)(layer)
    getattr(event, method)(2)


@pytest.mark.parametrize("cls", [LayerDoneCounter, LayerLoadingEvent])
@pytest.mark.parametrize(
    "num_layers, exc", [(True, TypeError), (2.0, TypeError), (0, ValueError), (-3, ValueError)]
)
def test_constructors_check_num_layers(cls, num_layers, exc):
    with pytest.raises(exc, match="num_layers"):
        cls(num_layers, "cpu")


@pytest.mark.parametrize("cls", [LayerDoneCounter, LayerLoadingEvent])
@pytest.mark.parametrize("device", ["gpu", "meta", 0])
def test_constructors_check_the_device(cls, device):
    with pytest.raises((TypeError, ValueError), match="device"):
        cls(2, device)
