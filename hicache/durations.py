"""Duration histograms: fixed buckets, counted where an operation ends, read in a snapshot.

An owner times an operation with a ``time.perf_counter`` pair (or CUDA timing events) and
calls ``observe``: one bisect over ``BUCKETS_S`` and two increments under an uncontended lock
(storage calls end on I/O threads). ``snapshot`` returns a frozen ``Durations`` that
``cache.stats()`` carries and the Prometheus exporter turns into a histogram. Importing this
module imports nothing of Prometheus.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from dataclasses import dataclass

__all__ = ["BUCKETS_S", "EMPTY", "DurationHistogram", "Durations"]

# Upper bounds in seconds: 100 us (a small CPU copy) to 60 s (a blocked storage call); the
# boundaries of SGLang's eviction, load-back and backup histograms where they overlap.
BUCKETS_S = (
    0.0001,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
    60.0,
)


@dataclass(frozen=True)
class Durations:
    """A histogram's snapshot.

    Attributes
    ----------
    counts : observations per bucket, ``len(BUCKETS_S) + 1`` of them: ``counts[i]`` those
        ``<= BUCKETS_S[i]`` (and above the bound before), the last those above every bound.
    sum_s : the sum of the observed seconds.
    """

    counts: tuple[int, ...] = (0,) * (len(BUCKETS_S) + 1)
    sum_s: float = 0.0

    @property
    def count(self) -> int:
        """How many durations were observed."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= it)`` per bucket, ``inf`` last (Prometheus' ``le``)."""
        bounds, total, out = (*BUCKETS_S, float("inf")), 0, []
        for bound, n in zip(bounds, self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


EMPTY = Durations()


class DurationHistogram:
    """The mutable counts behind a ``Durations``; thread-safe."""

    __slots__ = ("_counts", "_lock", "_sum")

    def __init__(self) -> None:
        self._counts = [0] * (len(BUCKETS_S) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        """Count one operation that took ``seconds`` (>= 0; a negative clock step counts 0)."""
        seconds = max(seconds, 0.0)
        i = bisect_left(BUCKETS_S, seconds)  # the first bound >= seconds; len(): above all
        with self._lock:
            self._counts[i] += 1
            self._sum += seconds

    def snapshot(self) -> Durations:
        with self._lock:
            return Durations(tuple(self._counts), self._sum)
