"""Per-layer completion of load batches: the forward pass waits for layer ``l`` only.

A load batch copies host KV back to the device one layer at a time on a load stream and records
one event per layer. Attention for layer ``l`` makes the compute stream wait for that layer's
event, so it starts as soon as layer ``l`` has arrived while later layers are still in flight. The
wait is a GPU-side ``cudaStreamWaitEvent``: the CPU never blocks. On CPU every transfer is
synchronous, the events are :class:`~hicache.devices.CompletedEvent` objects and every wait
returns at once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hicache.controller.layer_issue import DeferredFinish, LayerIssue
from hicache.devices import EventLike, canonical_device, current_stream, new_event

RING_SIZE = 3
"""Load batches a :class:`LayerDoneCounter` tracks at once: one being consumed by the forward
pass, one being produced, and one spare so producing never has to wait for the consumer."""

NO_CONSUMER = -1
"""``set_consumer(NO_CONSUMER)``: the next forward pass reads nothing that is being loaded."""


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def check_count(name: str, value: object) -> int:
    """``value`` if an int (not a bool) ``>= 1``: ``TypeError`` / ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def check_layer(where: str, layer: object, num_layers: int) -> int:
    """``layer`` if an int (not a bool) in ``[0, num_layers)``; errors name ``where`` and it."""
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise TypeError(f"{where}: layer must be an int, got {type(layer).__name__}")
    if not 0 <= layer < num_layers:
        raise ValueError(f"{where}: layer must be in [0, {num_layers}), got {layer}")
    return layer


class LayerLoadingEvent:
    """The events of one load batch: one per layer, plus the start and end of the batch.

    Parameters
    ----------
    num_layers : layers of the KV pool (int >= 1).
    device : device of the KV pool; CUDA gives ``torch.cuda.Event``s, CPU completed no-op events.
    layer_events : ``num_layers`` per-layer events to record again (those of a batch that has
        landed; creating 32 CUDA events costs ~50 us a batch); default: new ones.

    Attributes
    ----------
    load_events : ``num_layers`` events; event ``l`` is recorded once layer ``l`` of the batch
        has been issued on the load stream.
    start_event, finish_event : recorded on the load stream before the first and after the last
        layer; timing events (the transfer counters time the batch between them).
        ``finish_event.query()`` tells whether the whole batch has landed (an event never
        recorded counts as complete; a deferred batch's is a ``DeferredFinish``, see
        :meth:`defer`).
    issue : the :class:`~hicache.controller.layer_issue.LayerIssue` issuing the batch's later
        layers (:meth:`defer`), or None when every layer is issued up front.
    """

    def __init__(
        self,
        num_layers: int,
        device: torch.device | str,
        layer_events: list[EventLike] | None = None,
    ) -> None:
        self.num_layers = check_count("num_layers", num_layers)
        self.device = canonical_device(device)
        if layer_events is None:
            layer_events = [new_event(self.device) for _ in range(num_layers)]
        self.load_events: list[EventLike] = layer_events
        self.start_event: EventLike = new_event(self.device, timing=True)  # the batch's span
        self.finish_event: EventLike = new_event(self.device, timing=True)
        self.issue: LayerIssue | None = None

    def renewed(self) -> LayerLoadingEvent:
        """The next batch of this one's ring slot, once this one has landed: its per-layer
        events, recorded again, and new start and finish events (this batch's acks keep
        theirs). Its settings are this batch's, checked already."""
        batch = LayerLoadingEvent.__new__(LayerLoadingEvent)
        batch.num_layers, batch.device, batch.issue = self.num_layers, self.device, None
        batch.load_events = self.load_events
        batch.start_event = new_event(self.device, timing=True)
        batch.finish_event = new_event(self.device, timing=True)
        return batch

    def defer(self, issue: LayerIssue) -> None:
        """Leave the layers ``issue`` has not issued yet to it: :meth:`reach` (and so
        :meth:`wait`) issues them as a forward pass gets there, and ``finish_event`` becomes
        a :class:`~hicache.controller.layer_issue.DeferredFinish` (not done before the last
        layer is issued; its waits issue the rest first)."""
        self.issue = issue
        self.finish_event = DeferredFinish(self.finish_event, issue)

    def reach(self, layer: int) -> None:
        """Issue what a forward pass about to read ``layer`` needs of a deferred batch
        (``issue.reach``); nothing otherwise. Checks ``layer`` as :meth:`complete`."""
        check_layer("reach", layer, self.num_layers)
        if self.issue is not None:
            self.issue.reach(layer)

    def complete(self, layer: int, stream: torch.cuda.Stream | None = None) -> None:
        """Record layer ``layer``'s event on ``stream`` (default: the current stream, the load
        stream; passing it saves looking it up on every layer).

        Call it right after issuing that layer's copy: the event then fires when the copy is done.
        ``TypeError`` / ``ValueError`` unless ``layer`` is an int in ``[0, num_layers)``.
        """
        event = self.load_events[check_layer("complete", layer, self.num_layers)]
        event.record(current_stream(self.device) if stream is None else stream)

    def wait(self, layer: int) -> None:
        """Make the current stream (the compute stream) wait for layer ``layer``'s event.

        GPU-side only: the CPU returns at once and work queued afterwards on the current stream
        runs after the layer has landed. A no-op on CPU (after :meth:`reach`, which issues the
        layer first when the batch is deferred). Checks ``layer`` as :meth:`complete`.
        """
        check_layer("wait", layer, self.num_layers)
        if self.issue is not None:
            self.issue.reach(layer)
        self.load_events[layer].wait(current_stream(self.device))


class LayerDoneCounter:
    """A ring of :data:`RING_SIZE` load batches, one :class:`LayerLoadingEvent` per slot.

    The producer (the cache controller) takes a slot with :meth:`update_producer` for each load
    batch it issues; the scheduler tells the forward pass which batch its KV comes from with
    :meth:`set_consumer`; the device KV pool calls :meth:`wait_until` before handing out a layer's
    buffer. The ring lets a new batch be produced while the forward pass still consumes the
    previous one.

    Parameters
    ----------
    num_layers : layers of the KV pool (int >= 1).
    device : device of the KV pool (CPU or an existing CUDA device; ``ValueError`` otherwise).
        Default: CUDA when available, else CPU.

    Attributes
    ----------
    events : the ``RING_SIZE`` :class:`LayerLoadingEvent`s, indexed by slot.
    waits : ``wait_until`` calls that waited on a consumer batch (a count; never reset).
    skip_wait_for_testing : test-facing switch (False); when True :meth:`wait_until` does not
        wait at all, so a GPU test can show that without the wait the forward pass can read
        stale KV. Never set it outside tests.

    Raises
    ------
    TypeError / ValueError
        ``num_layers`` is not a positive int, or ``device`` is not a usable device.
    """

    _producer: int  # ``reset`` sets these
    _consumer: int

    def __init__(self, num_layers: int, device: torch.device | str | None = None) -> None:
        self.num_layers = check_count("num_layers", num_layers)
        self.device = canonical_device(_default_device() if device is None else device)
        self.events = [LayerLoadingEvent(num_layers, self.device) for _ in range(RING_SIZE)]
        self.skip_wait_for_testing = False
        self.waits = 0  # wait_until calls that waited on a batch (never reset)
        self.reset()

    @property
    def producer_index(self) -> int:
        """Slot of the batch produced last, or -1 when none was produced since the last reset."""
        return self._producer

    @property
    def consumer_index(self) -> int:
        """Slot the forward pass waits on, or :data:`NO_CONSUMER`."""
        return self._consumer

    @property
    def next_producer(self) -> int:
        """The slot :meth:`update_producer` will take next (a query; changes nothing)."""
        return (self._producer + 1) % RING_SIZE

    def update_producer(self, wait: Callable[[EventLike], None] | None = None) -> int:
        """Take the next ring slot for a new load batch and return its index.

        The slot gets a new :class:`LayerLoadingEvent` (``events[index]``) on which the caller
        records the batch's events: new start and finish events (acks of the previous batch keep
        theirs) and the previous batch's per-layer events, recorded again (that batch has
        landed; a forward pass consuming the slot waits on the new batch either way).

        ``wait``: called with the slot's ``finish_event`` when its batch is still in flight,
        and must block until it has landed (the controller synchronizes it, counted); None:
        raise instead.

        Raises
        ------
        RuntimeError
            The slot still holds a batch whose ``finish_event`` has not completed and ``wait``
            is None: reusing it would let a waiting forward pass read layers that have not
            landed. State unchanged.
        """
        index = (self._producer + 1) % RING_SIZE  # ``next_producer``
        batch = self.events[index]
        if not batch.finish_event.query():
            if wait is not None:
                wait(batch.finish_event)
                return self.update_producer()  # landed now: raises if it did not
            raise RuntimeError(
                f"LayerDoneCounter: slot {index} still holds a load batch in flight; "
                f"at most {RING_SIZE} batches can be outstanding"
            )
        self.events[index] = batch.renewed()
        self._producer = index
        self._produced.add(index)
        return index

    def set_consumer(self, index: int) -> None:
        """Make later :meth:`wait_until` calls wait on batch ``index`` (-1: wait on nothing).

        Raises
        ------
        TypeError / ValueError
            ``index`` is not an int, or is neither -1 nor a slot produced since the last reset.
            State unchanged.
        """
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"set_consumer: index must be an int, got {type(index).__name__}")
        if index != NO_CONSUMER and index not in self._produced:
            raise ValueError(
                f"set_consumer: index must be -1 or a produced slot {sorted(self._produced)}, "
                f"got {index}"
            )
        self._consumer = index

    def wait_until(self, layer: int) -> None:
        """Make the current (compute) stream wait for layer ``layer`` of the consumer batch.

        GPU-side wait (``event.wait(stream)``); never blocks the CPU. Returns at once when no
        consumer is set, on CPU, or when ``skip_wait_for_testing`` is set; a consumer batch
        whose later layers are deferred (``LayerLoadingEvent.defer``) has them issued first.

        Raises
        ------
        TypeError / ValueError
            ``layer`` is not an int (bools and floats included) in ``[0, num_layers)``.
        """
        check_layer("wait_until", layer, self.num_layers)
        if self._consumer == NO_CONSUMER:
            return
        batch = self.events[self._consumer]
        if self.skip_wait_for_testing:
            batch.reach(layer)
            return
        self.waits += 1
        batch.wait(layer)

    def reset(self) -> None:
        """Forget every produced batch and the consumer (the events themselves are kept).

        A slot whose batch is still in flight stays unusable until it finishes:
        :meth:`update_producer` checks its ``finish_event``.
        """
        self._producer = -1
        self._consumer = NO_CONSUMER
        self._produced: set[int] = set()
