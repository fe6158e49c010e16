"""The layers of one load batch, issued up front or as the forward pass reaches them.

``start_loading`` plans a batch once. Issuing all of its layers then costs the CPU ~25 us a
layer before the forward pass can even be launched (~1 ms for 32 layers, more with many
runs), time the device-hit request never pays. With ``layers_ahead = n`` only the first ``n``
layers are issued there; every later ``wait_until(l)`` of the forward pass first issues the
layers through ``l + n``, so the load stream keeps ``n`` layers queued ahead of the one being
read while the CPU interleaves their issue with the forward's launches.

A batch not yet fully issued is not finished: its :class:`DeferredFinish` says so on
``query()`` and issues the rest before ``synchronize()`` or ``wait()``, so nothing that waits
for the batch can see it complete early. The controller issues the rest too before any other
batch or transfer call (``HiCacheController.issue_pending``), so a batch whose layers are
never read still lands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hicache.controller.stats import BatchClock
from hicache.devices import EventLike, stream_scope
from hicache.pools.load_plan import LayerRunner


class LayerIssue:
    """Issues layers ``0 .. num_layers - 1`` of one planned load batch, in order, on ``stream``.

    Parameters
    ----------
    plan : the batch's plan (``HostKVPool.plan_load``).
    num_layers : layers of the device pool.
    stream : the load stream (None on CPU).
    complete : records layer ``l``'s event on ``stream`` (``LayerLoadingEvent.complete``).
    on_done : runs once, in ``stream``'s scope, after the last layer: records the batch's
        finish event and ends ``clock`` at it.
    ahead : layers kept issued beyond the one a forward pass waits for (``reach``).
    clock : the batch's busy time (``BusyClock.begin``): each call that issues layers is a
        span of it, so the stream's idle time between deferred issues is not counted.

    Attributes
    ----------
    issued : layers ``0 .. issued - 1`` are on the stream.
    done : whether every layer (and the batch's end) has been issued.
    """

    def __init__(
        self,
        plan: LayerRunner,
        num_layers: int,
        stream: torch.cuda.Stream | None,
        complete: Callable[[int, torch.cuda.Stream | None], None],
        on_done: Callable[[], None],
        ahead: int,
        clock: BatchClock,
    ) -> None:
        self._plan = plan
        self._clock = clock
        self._stream = stream
        self._complete = complete
        self._on_done = on_done
        self.num_layers = num_layers
        self.ahead = ahead
        self.issued = 0
        self.done = num_layers == 0  # kept by ``through``

    def through(self, layer: int) -> None:
        """Issue every layer up to ``layer`` (capped at the last) not yet issued. A layer
        that raises stays unissued, with the ones after it: a later call retries it."""
        stop = min(layer + 1, self.num_layers)
        if stop <= self.issued:
            return
        with stream_scope(self._stream):
            self._clock.resume(self._stream)
            while self.issued < stop:
                self._plan.run(self.issued)
                self._complete(self.issued, self._stream)
                self.issued += 1
            self.done = self.issued == self.num_layers
            if self.done:
                self._on_done()  # closes the clock's span at the batch's finish event
            else:
                self._clock.pause(self._stream)

    def reach(self, layer: int) -> None:
        """Before a forward pass waits for ``layer``: issue through ``layer + ahead``."""
        self.through(layer + self.ahead)

    def finish(self) -> None:
        """Issue every layer left."""
        self.through(self.num_layers - 1)


class DeferredFinish:
    """The ``finish_event`` of a batch whose layers may not all be issued yet.

    ``query()`` is False until every layer is issued (an event never recorded would read
    True); ``synchronize()`` and ``wait()`` issue the rest first. Otherwise ``event``'s.
    """

    def __init__(self, event: EventLike, issue: LayerIssue) -> None:
        self.event = event
        self._issue = issue

    def record(self, stream: Any = None) -> None:
        self.event.record(stream)

    def query(self) -> bool:
        return self._issue.done and self.event.query()

    def synchronize(self) -> None:
        self._issue.finish()
        self.event.synchronize()

    def wait(self, stream: Any = None) -> None:
        self._issue.finish()
        self.event.wait(stream)
