"""Transfer counters of a ``HiCacheController``: bytes, busy time and batches per direction.

Counting costs one increment per issued batch; nothing runs on the radix tree's paths. Busy
time is wall time around the synchronous copy on CPU; on CUDA a pair of timing events recorded
on the transfer stream around the batch, resolved (``elapsed_time``) only once the end event
has completed, when ``settle`` is called (at each issue and each snapshot), so counting never
blocks. ``h2d`` is host -> device (load-back), ``d2h`` device -> host (backup). The same
per-batch durations feed one ``DurationHistogram`` per direction.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch

from hicache.controller.operations import CacheOperation, HiCacheAck
from hicache.devices import is_cuda
from hicache.durations import DurationHistogram, Durations
from hicache.pools import HostKVPool


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


class BusyClock:
    """Bytes, batches and busy seconds of one direction's batches on ``device``; a token
    moves ``token_bytes`` (every layer)."""

    def __init__(self, device: torch.device, token_bytes: int) -> None:
        self.cuda, self.token_bytes = is_cuda(device), token_bytes
        self.bytes = self.batches = 0
        self._seconds = 0.0
        self.durations = DurationHistogram()
        self._pending: deque[tuple[torch.cuda.Event, torch.cuda.Event]] = deque()

    def begin(self) -> float | torch.cuda.Event:
        """Mark the start of a batch on the current stream (call inside its stream scope)."""
        if not self.cuda:
            return time.perf_counter()
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        return start

    def end(self, mark: float | torch.cuda.Event, tokens: int) -> None:
        """Close the batch opened by ``begin`` (same stream) that moved ``tokens``."""
        self.bytes += tokens * self.token_bytes
        self.batches += 1
        if isinstance(mark, float):
            self._done(time.perf_counter() - mark)
            return
        finish = torch.cuda.Event(enable_timing=True)
        finish.record()
        self._pending.append((mark, finish))
        self.settle()  # keeps the pending pairs few

    def settle(self) -> float:
        """Busy seconds of the completed batches (never blocks); batches on one stream finish
        in issue order, so this stops at the first one still running."""
        pending = self._pending
        while pending and pending[0][1].query():
            start, finish = pending.popleft()
            self._done(start.elapsed_time(finish) / 1e3)
        return self._seconds

    def _done(self, seconds: float) -> None:
        self._seconds += seconds
        self.durations.observe(seconds)


class TransferCounters:
    """A controller's counters: one ``BusyClock`` per direction (tokens of ``host_pool``'s
    geometry) and the blocking waits."""

    def __init__(self, device: torch.device, host_pool: HostKVPool) -> None:
        token_bytes = host_pool.layout_dim * host_pool.parts
        self.h2d, self.d2h = BusyClock(device, token_bytes), BusyClock(device, token_bytes)
        self.blocking_waits = 0

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
