"""StorageStats: the counters of one guarded storage backend (``GuardedStorage.stats``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hicache.durations import EMPTY, Durations

__all__ = ["StorageStats"]


@dataclass(frozen=True)
class StorageStats:
    """Counters of one guarded backend since it was built.

    Attributes
    ----------
    backend : the guard's ``name``.
    queries, query_pages, hit_pages : ``batch_exists`` calls, pages asked, pages reported
        present.
    pages_read, pages_written : pages ``batch_get_v1`` / ``batch_set_v1`` reported done (a set
        counts pages that were already present too).
    bytes_read, bytes_written : those pages times the bytes of a page (all its objects).
    read_seconds, write_seconds : time inside the backend's get / set calls.
    failures : calls that raised, returned a malformed result, that a ``ReportsFailures``
        backend reported as failed (Mooncake's failed RPCs, the file store's I/O errors and
        corrupt objects), or (with a breaker) ran slower than its ``slow_call_s``;
        and ``clear``/``close`` calls that raised.
    refused : calls the open breaker refused (fast misses).
    timeouts : calls that did not return within ``StorageConfig.call_timeout_s`` (misses,
        also counted in ``failures``; abandoned, their results discarded).
    breaker_state : ``closed``/``open``/``half_open``, or ``none`` without a breaker.
    breaker_trips : how many times the breaker opened (0 without one).
    faults : faults by kind (``hicache.backends.faults``: ``io_<ERRNO>`` such as ``io_ENOSPC``,
        ``corrupt_object``, ``backend_error``, ``malformed_result``, ``slow_call``,
        ``breaker_trip``), the guard's and a ``ReportsFaults`` backend's; every kind seen at
        least once, none other.
    exists_call_seconds, get_call_seconds, set_call_seconds : the duration of each
        ``batch_exists`` / ``batch_get_v1`` / ``batch_set_v1`` call that reached the backend.
    used_bytes, capacity_bytes : the backend's ``get_stats()`` ``bytes_used`` / ``max_bytes``
        (the whole store, every instance sharing it) read after set-up, each write and
        ``clear``; None when the backend does not report them.
    """

    backend: str
    queries: int = 0
    query_pages: int = 0
    hit_pages: int = 0
    pages_read: int = 0
    pages_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    read_seconds: float = 0.0
    write_seconds: float = 0.0
    failures: int = 0
    refused: int = 0
    timeouts: int = 0
    breaker_state: str = "none"
    breaker_trips: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    exists_call_seconds: Durations = EMPTY
    get_call_seconds: Durations = EMPTY
    set_call_seconds: Durations = EMPTY
    used_bytes: int | None = None
    capacity_bytes: int | None = None

    @property
    def read_gbps(self) -> float:
        """``bytes_read / read_seconds`` in GB/s (1e9 bytes), 0.0 before any read time."""
        return self.bytes_read / self.read_seconds / 1e9 if self.read_seconds > 0 else 0.0

    @property
    def write_gbps(self) -> float:
        """``bytes_written / write_seconds`` in GB/s (1e9 bytes), 0.0 before any write time."""
        return self.bytes_written / self.write_seconds / 1e9 if self.write_seconds > 0 else 0.0
