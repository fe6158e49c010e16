"""Transfer counters of a ``HiCacheController``: bytes, busy time and batches per direction.

Counting costs one increment per issued batch; nothing runs on the radix tree's paths. Busy
time is the time the transfer stream spent on a batch, not the time the CPU took to dispatch
it: on CUDA a pair of timing events recorded on the transfer stream around each span of the
batch (a whole backup or load; a load whose later layers are issued as the forward pass
reaches them, ``layers_ahead``, has one span per issue, so the stream's idle time between them
is not counted), resolved (``elapsed_time``) only once the batch's last event has completed,
when ``settle`` is called (at each issue, each ack processed and each snapshot), so counting
never blocks. On CPU the same spans are wall time around the synchronous copies. ``h2d`` is
host -> device (load-back), ``d2h`` device -> host (backup). The same per-batch durations feed
one ``DurationHistogram`` per direction.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from hicache.controller.operations import CacheOperation, HiCacheAck
from hicache.devices import is_cuda
from hicache.durations import DurationHistogram, Durations
from hicache.pools import HostPool


@dataclass(frozen=True)
class TransferStats:
    """A snapshot of one controller's transfers. Counters only grow (``reset`` keeps them).

    Attributes
    ----------
    h2d_bytes, d2h_bytes : KV bytes of the issued load / backup batches (every layer).
    h2d_seconds, d2h_seconds : busy time of the batches that have completed.
    load_batches, write_batches : batches issued.
    load_queue_tokens, write_queue_tokens : tokens queued and not yet issued (gauges).
    loads_in_flight, writes_in_flight : issued batches whose acks are not popped yet (gauges).
    layer_waits : forward-pass layer reads ordered after a load batch (``wait_until`` with a
        consumer set; GPU-side waits, the CPU does not block).
    blocking_waits : times the CPU blocked on a transfer: ``start_loading`` with every ring slot
        in flight, or ``drain`` with a batch still in flight.
    integrity_failures : host pages found corrupt at load-back (0 with ``verify="off"``).
    h2d_batch_seconds, d2h_batch_seconds : the busy time of each completed batch, a histogram
        (a load-back / a backup batch: SGLang's ``load_back_duration_seconds`` and
        ``hicache_backup_duration_seconds``).
    """

    h2d_bytes: int
    d2h_bytes: int
    h2d_seconds: float
    d2h_seconds: float
    load_batches: int
    write_batches: int
    load_queue_tokens: int
    write_queue_tokens: int
    loads_in_flight: int
    writes_in_flight: int
    layer_waits: int
    blocking_waits: int
    integrity_failures: int
    h2d_batch_seconds: Durations
    d2h_batch_seconds: Durations


class BatchClock:
    """The busy time of one batch: the sum of its spans, each opened by :meth:`resume` and
    closed by :meth:`pause` on the batch's stream. CUDA timing events on ``cuda`` (recorded on
    the stream given, or given already recorded: a batch's own start and finish events serve,
    so timing adds no event of its own), wall time otherwise."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.seconds = 0.0  # CPU: the closed spans' wall time
        self.spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._open: float | torch.cuda.Event | None = None

    def resume(self, stream: torch.cuda.Stream | None = None, opened: Any = None) -> None:
        """Open a span (a no-op while one is open): at ``opened`` (a timing event just recorded
        on the batch's stream) or at a new event recorded on ``stream`` (CUDA; the current
        stream when None)."""
        if self._open is not None:
            return
        if not self.cuda:
            self._open = time.perf_counter()
            return
        self._open = opened if opened is not None else _recorded(stream)

    def pause(self, stream: torch.cuda.Stream | None = None, closed: Any = None) -> None:
        """Close the open span (a no-op when none is open), at ``closed`` or a new event on
        ``stream``, as :meth:`resume`."""
        start, self._open = self._open, None
        if isinstance(start, float):
            self.seconds += time.perf_counter() - start
        elif start is not None:
            self.spans.append((start, closed if closed is not None else _recorded(stream)))

    def landed(self) -> bool:
        """Whether every closed span has run (never blocks; spans on one stream run in order)."""
        return not self.spans or self.spans[-1][1].query()

    def elapsed(self) -> float:
        """Busy seconds of the closed spans; on CUDA only once :meth:`landed`."""
        if not self.spans:  # CPU: wall time only
            return self.seconds
        gpu_ms: float = sum(s.elapsed_time(f) for s, f in self.spans)
        return self.seconds + gpu_ms / 1e3


def _recorded(stream: torch.cuda.Stream | None) -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record(stream)
    return event


class BusyClock:
    """Bytes, batches and busy seconds of one direction's batches on ``device``; a token
    moves ``token_bytes`` (every layer)."""

    def __init__(self, device: torch.device, token_bytes: int) -> None:
        self.cuda, self.token_bytes = is_cuda(device), token_bytes
        self.bytes = self.batches = 0
        self._seconds = 0.0
        self.durations = DurationHistogram()
        self._pending: deque[BatchClock] = deque()

    def begin(self, opened: Any = None) -> BatchClock:
        """A new batch's clock with its first span open: at ``opened`` on CUDA (the batch's
        start event, a timing event just recorded on its stream), else at a new event on the
        current stream (call inside the batch's stream scope)."""
        clock = BatchClock(self.cuda)
        clock.resume(opened=opened)
        return clock

    def begin_span(self, opened: Any = None) -> BatchClock | float:
        """``begin`` of a batch timed in one span (no ``resume``/``pause`` between): on CPU
        just its start's wall time (no clock object)."""
        return self.begin(opened) if self.cuda else time.perf_counter()

    def end(self, clock: BatchClock | float, tokens: int, closed: Any = None) -> None:
        """Close the batch ``begin`` or ``begin_span`` opened that moved ``tokens``: its open
        span at ``closed`` on CUDA (the batch's finish event, just recorded on its stream),
        else at a new event on the current stream."""
        if isinstance(clock, float):  # ``begin_span`` on CPU: its one span ends now
            self._done(time.perf_counter() - clock)
        else:
            clock.pause(closed=closed)
        self.bytes += tokens * self.token_bytes
        self.batches += 1
        if isinstance(clock, BatchClock):
            if clock.cuda:
                self._pending.append(clock)
                self.settle()  # keeps the pending batches few
            else:
                self._done(clock.elapsed())

    def settle(self) -> float:
        """Busy seconds of the completed batches (never blocks); batches on one stream finish
        in issue order, so this stops at the first one still running."""
        pending = self._pending
        while pending and pending[0].landed():
            self._done(pending.popleft().elapsed())
        return self._seconds

    def _done(self, seconds: float) -> None:
        self._seconds += seconds
        self.durations.observe(seconds)


class TransferCounters:
    """A controller's counters: one ``BusyClock`` per direction (tokens of ``host_pool``'s
    geometry) and the blocking waits."""

    def __init__(self, device: torch.device, host_pool: HostPool) -> None:
        token_bytes = host_pool.slot_bytes
        self.h2d, self.d2h = BusyClock(device, token_bytes), BusyClock(device, token_bytes)
        self.blocking_waits = 0

    def settle(self) -> None:
        """Resolve the busy time of every batch that has landed, both ways (never blocks). On
        CPU a batch is resolved when it ends (``BusyClock.end``): nothing is left to do."""
        if self.h2d.cuda:
            self.h2d.settle()
            self.d2h.settle()

    def snapshot(
        self,
        queues: tuple[list[CacheOperation], list[CacheOperation]],
        acks: tuple[list[HiCacheAck], list[HiCacheAck]],
        layer_waits: int,
        integrity_failures: int,
    ) -> TransferStats:
        """The snapshot, given the (load, write) queues and ack queues and the other owners'
        counts."""
        return TransferStats(
            h2d_bytes=self.h2d.bytes,
            d2h_bytes=self.d2h.bytes,
            h2d_seconds=self.h2d.settle(),
            d2h_seconds=self.d2h.settle(),
            load_batches=self.h2d.batches,
            write_batches=self.d2h.batches,
            load_queue_tokens=sum(len(op) for op in queues[0]),
            write_queue_tokens=sum(len(op) for op in queues[1]),
            loads_in_flight=len(acks[0]),
            writes_in_flight=len(acks[1]),
            layer_waits=layer_waits,
            blocking_waits=self.blocking_waits,
            integrity_failures=integrity_failures,
            h2d_batch_seconds=self.h2d.durations.snapshot(),
            d2h_batch_seconds=self.d2h.durations.snapshot(),
        )
