"""Frozen snapshots of a cache's counters (``BasePrefixCache.stats``), one per owner.

Each owner counts what it does with plain integer increments, no locks and no clock reads on
the match/insert path: the cache its lookups and inserts (``PrefixStats``), the ``Ledger`` the
device tier (``DeviceStats``), the ``HostTier`` the host tier (``HostStats``), the controller
the transfers (``TransferStats``, ``controller.stats``). Counters (``*_total`` in the
exporter) only grow over a cache's life, ``reset`` included; the other fields are gauges.

Tokens computed are not the cache's to count: the engine knows which prefill tokens it runs
(a scheduler may retry an admission, which matches again; a host hit below
``load_back_threshold`` is recomputed). When every request is matched once,
``query_tokens - device_hit_tokens - host.load_back_tokens`` is what was left to compute.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hicache.controller.stats import TransferStats
from hicache.durations import EMPTY, Durations

if TYPE_CHECKING:
    from hicache.backends.storage_stats import StorageStats


@dataclass(frozen=True)
class PrefixStats:
    """Lookups and inserts, counted by the cache.

    match_calls, query_tokens : ``match_prefix`` calls and the tokens of their keys.
    device_hit_tokens, host_hit_tokens : tokens they found on the device and, past it, only
        on the host (``len(device_indices)``, ``host_hit_length``).
    insert_calls : ``insert`` and ``cache_*_req`` calls.
    inserted_tokens : tokens those calls added to the device tier (new in the tree, or
        given to a host-only node); the duplicates and unaligned tails they free are not.

    A disabled cache counts nothing.
    """

    match_calls: int
    query_tokens: int
    device_hit_tokens: int
    host_hit_tokens: int
    insert_calls: int
    inserted_tokens: int


@dataclass(frozen=True)
class DeviceStats:
    """The device tier (L1), from the ``Ledger``.

    evicted_tokens : device tokens freed by ``evict`` (counter), kept as host-only nodes
        or deleted.
    evictable_tokens, protected_tokens : device tokens in unlocked / locked nodes (gauges).
    capacity_tokens : usable device slots of the allocator; None for a pure index.
    free_tokens : slots the allocator can hand out now (neither cached nor held by a running
        request); None for a pure index.
    eviction_seconds : the duration of each eviction pass (``evict``), a histogram.
    """

    evicted_tokens: int
    evictable_tokens: int
    protected_tokens: int
    capacity_tokens: int | None
    free_tokens: int | None = None
    eviction_seconds: Durations = EMPTY


@dataclass(frozen=True)
class HostStats:
    """The host tier (L2), from the ``HostTier``.

    backup_tokens : tokens queued for a backup device -> host (counter).
    load_backs, load_back_tokens : load-backs queued host -> device and their tokens.
    evicted_tokens : host tokens freed by host eviction (``evict_host``, and the evictions a
        backup runs to make room).
    size_tokens, capacity_tokens : tokens with a host copy (writes in flight included) and
        host slots (gauges).
    pending_writes, pending_loads : nodes awaiting a write / load ack (gauges).
    tiering : ``inclusive`` or ``exclusive`` (``HiCacheConfig.tiering``).
    """

    backup_tokens: int
    load_backs: int
    load_back_tokens: int
    evicted_tokens: int
    size_tokens: int
    capacity_tokens: int
    pending_writes: int
    pending_loads: int
    tiering: str = "inclusive"


@dataclass(frozen=True)
class StorageTierStats:
    """The storage tier (L3), from the ``StorageTier`` and its guarded backend.

    backend : the backend's name (``file``, ``mooncake``, ...).
    queries, query_pages, hit_pages : existence queries, the pages they asked about, and the
        pages storage reported present (counters).
    prefetches : prefetches started (a query was sent).
    prefetch_revoked : prefetches ended by their query (a hit below ``prefetch_threshold``).
    prefetch_skipped_slower : prefetches not loaded because loading would take longer than
        recomputing (``hicache.backends.cost``).
    prefetch_loaded_tokens : tokens prefetches inserted into the tree as host-only nodes.
    backup_pages : pages written to storage (present afterwards) by backups.
    eviction_write_pages : of ``backup_pages``, those written when the host tier evicted their
        node (``StorageConfig.tiering`` exclusive); the rest were written when their host
        backup landed (inclusive).
    eviction_dropped_pages : pages the host tier evicted under exclusive tiering after their
        storage write failed (lost, not served).
    pending_prefetches, pending_backups : prefetches and node backups in flight (gauges).
    bytes_read, bytes_written, read_seconds, write_seconds : storage traffic and busy time.
    failures : backend calls that failed (errors, exceptions) or were refused by the breaker.
    breaker_state : ``closed``, ``open`` or ``half_open`` (``none``: no breaker).
    breaker_trips : how many times the breaker opened.
    faults : faults by kind (``StorageStats.faults``: I/O errors by errno, corrupt objects,
        backend errors, slow calls, breaker trips), each kind seen at least once.
    exists_call_seconds, get_call_seconds, set_call_seconds : histograms of the backend calls'
        durations (existence queries, reads, writes).
    used_bytes, capacity_bytes : the store's bytes and cap as of the last write (None: the
        backend does not say).
    """

    backend: str
    queries: int
    query_pages: int
    hit_pages: int
    prefetches: int
    prefetch_revoked: int
    prefetch_skipped_slower: int
    prefetch_loaded_tokens: int
    backup_pages: int
    pending_prefetches: int
    pending_backups: int
    bytes_read: int
    bytes_written: int
    read_seconds: float
    write_seconds: float
    failures: int
    breaker_state: str
    breaker_trips: int = 0
    eviction_write_pages: int = 0
    eviction_dropped_pages: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    exists_call_seconds: Durations = EMPTY
    get_call_seconds: Durations = EMPTY
    set_call_seconds: Durations = EMPTY
    used_bytes: int | None = None
    capacity_bytes: int | None = None

    @classmethod
    def of(cls, backend: StorageStats, **tier: int) -> StorageTierStats:
        """The tier's counters ``tier`` (the fields not read from the backend's ``backend``)."""
        return cls(
            backend=backend.backend,
            queries=backend.queries,
            query_pages=backend.query_pages,
            hit_pages=backend.hit_pages,
            bytes_read=backend.bytes_read,
            bytes_written=backend.bytes_written,
            read_seconds=backend.read_seconds,
            write_seconds=backend.write_seconds,
            failures=backend.failures + backend.refused,
            breaker_state=backend.breaker_state,
            breaker_trips=backend.breaker_trips,
            faults=backend.faults,
            exists_call_seconds=backend.exists_call_seconds,
            get_call_seconds=backend.get_call_seconds,
            set_call_seconds=backend.set_call_seconds,
            used_bytes=backend.used_bytes,
            capacity_bytes=backend.capacity_bytes,
            **tier,
        )

    @property
    def read_gbps(self) -> float:
        return self.bytes_read / self.read_seconds / 1e9 if self.read_seconds > 0 else 0.0

    @property
    def write_gbps(self) -> float:
        return self.bytes_written / self.write_seconds / 1e9 if self.write_seconds > 0 else 0.0


@dataclass(frozen=True)
class CacheStats:
    """One cache's snapshot; ``host`` and ``transfer`` are None without a host tier,
    ``storage`` without a storage tier."""

    prefix: PrefixStats
    device: DeviceStats
    host: HostStats | None = None
    transfer: TransferStats | None = None
    storage: StorageTierStats | None = None

    def as_dict(self) -> dict[str, Any]:
        """Nested plain dicts (JSON-able)."""
        return dataclasses.asdict(self)


class PrefixCounter:
    """The mutable counts behind ``PrefixStats`` (the cache's own)."""

    __slots__ = (
        "match_calls",
        "query_tokens",
        "device_hit_tokens",
        "host_hit_tokens",
        "insert_calls",
        "inserted_tokens",
    )

    def __init__(self) -> None:
        self.match_calls = self.query_tokens = 0
        self.device_hit_tokens = self.host_hit_tokens = 0
        self.insert_calls = self.inserted_tokens = 0

    def matched(self, query: int, device: int, host: int) -> None:
        self.match_calls += 1
        self.query_tokens += query
        self.device_hit_tokens += device
        self.host_hit_tokens += host

    def inserted(self, tokens: int) -> None:
        self.insert_calls += 1
        self.inserted_tokens += tokens

    def snapshot(self) -> PrefixStats:
        return PrefixStats(*(getattr(self, name) for name in self.__slots__))
