"""A ``CacheStats`` snapshot as metric samples, and SGLang's names for those it shares.

Pure Python (no Prometheus import): ``rows(stats)`` yields ``(name, kind, help, labels,
value)`` per sample, the name without prefix or ``_total``; a histogram's value is a
``Durations``. ``sglang_row`` renames a row SGLang exports under another name (the exporter's
``naming="sglang"``); ``SGLANG_NAMES`` is that table, and the README's "Metrics" section
prints it with vLLM's nearest series.
"""

from __future__ import annotations

from collections.abc import Iterator

from hicache.durations import Durations
from hicache.radix.stats import CacheStats

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
Row = tuple[str, str, str, dict[str, str], "float | Durations"]
BREAKER_STATES = ("closed", "open", "half_open")  # gauge values 0, 1, 2
# (our name, the labels that select the sample) -> (SGLang's name, labels SGLang puts instead)
SGLANG_NAMES: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, dict[str, str]]] = {
    ("cache_hit_tokens", (("tier", "device"),)): ("cached_tokens", {"cache_source": "device"}),
    ("cache_hit_tokens", (("tier", "host"),)): ("cached_tokens", {"cache_source": "host"}),
    ("evicted_tokens", (("tier", "device"),)): ("evicted_tokens", {}),
    ("tokens", (("state", "evictable"), ("tier", "device"))): ("kv_evictable_tokens", {}),
    ("free_tokens", (("tier", "device"),)): ("kv_available_tokens", {}),
    ("tokens", (("state", "cached"), ("tier", "host"))): ("hicache_host_used_tokens", {}),
    ("capacity_tokens", (("tier", "host"),)): ("hicache_host_total_tokens", {}),
    ("backup_tokens", ()): ("hicache_backup_tokens", {"pool": "kv"}),
    ("load_back_tokens", ()): ("load_back_tokens", {"pool": "kv"}),
    ("transfer_bytes", (("direction", "h2d"),)): ("load_back_bytes", {}),
    ("transfer_bytes", (("direction", "d2h"),)): ("hicache_backup_bytes", {}),
    ("transfer_duration_seconds", (("direction", "h2d"),)): ("load_back_duration_seconds", {}),
    ("transfer_duration_seconds", (("direction", "d2h"),)): (
        "hicache_backup_duration_seconds",
        {},
    ),
    ("eviction_duration_seconds", (("tier", "device"),)): ("eviction_duration_seconds", {}),
    ("storage_prefetch_loaded_tokens", ()): ("prefetched_tokens", {}),
}
_SELECTORS = {"tier", "state", "direction"}  # the labels a row of ``SGLANG_NAMES`` selects on


def sglang_row(name: str, labels: dict[str, str]) -> tuple[str, dict[str, str]] | None:
    """SGLang's name (without ``sglang:``) and labels for our ``name`` with ``labels``, or
    None when SGLang has no series of that meaning. Labels other than the selectors stay."""
    selected = tuple(sorted((k, v) for k, v in labels.items() if k in _SELECTORS))
    found = SGLANG_NAMES.get((name, selected))
    if found is None:
        return None
    kept = {k: v for k, v in labels.items() if k not in _SELECTORS}
    return found[0], {**kept, **found[1]}


def rows(s: CacheStats) -> Iterator[Row]:
    """Every sample of ``s``: (name without prefix, kind, help, labels, value)."""
    p = s.prefix
    yield "match_calls", COUNTER, "match_prefix calls", {}, p.match_calls
    yield "prefix_query_tokens", COUNTER, "Tokens looked up by match_prefix", {}, p.query_tokens
    hit = "Tokens match_prefix found, by tier"
    yield "cache_hit_tokens", COUNTER, hit, {"tier": "device"}, p.device_hit_tokens
    if s.host is not None:
        yield "cache_hit_tokens", COUNTER, hit, {"tier": "host"}, p.host_hit_tokens
    yield "insert_calls", COUNTER, "insert and cache_*_req calls", {}, p.insert_calls
    yield "inserted_tokens", COUNTER, "Tokens added to the cache", {}, p.inserted_tokens
    yield from _device_rows(s)
    yield from _host_rows(s)
    yield from _transfer_rows(s)
    yield from _storage_rows(s)
    yield from _component_rows(s)


_EVICTED = "Tokens evicted, by tier"
_SIZE = "Cached tokens, by tier and state"
_CAPACITY = "Token slots, by tier"
_USAGE = "Occupied share of the tier (0-1): device slots not free, host slots cached, store bytes"


def _device_rows(s: CacheStats) -> Iterator[Row]:
    d, dev = s.device, {"tier": "device"}
    yield "evicted_tokens", COUNTER, _EVICTED, dev, d.evicted_tokens
    yield "tokens", GAUGE, _SIZE, {**dev, "state": "evictable"}, d.evictable_tokens
    yield "tokens", GAUGE, _SIZE, {**dev, "state": "protected"}, d.protected_tokens
    if d.capacity_tokens is not None and d.free_tokens is not None:
        yield "capacity_tokens", GAUGE, _CAPACITY, dev, d.capacity_tokens
        yield "free_tokens", GAUGE, "Token slots free to allocate, by tier", dev, d.free_tokens
        used = d.capacity_tokens - d.free_tokens
        yield "usage_ratio", GAUGE, _USAGE, dev, used / max(d.capacity_tokens, 1)
    doc = "Duration of each eviction pass"
    yield "eviction_duration_seconds", HISTOGRAM, doc, dev, d.eviction_seconds


def _host_rows(s: CacheStats) -> Iterator[Row]:
    h, host = s.host, {"tier": "host"}
    if h is None:
        return
    yield "evicted_tokens", COUNTER, _EVICTED, host, h.evicted_tokens
    yield "tokens", GAUGE, _SIZE, {**host, "state": "cached"}, h.size_tokens
    yield "capacity_tokens", GAUGE, _CAPACITY, host, h.capacity_tokens
    yield "usage_ratio", GAUGE, _USAGE, host, h.size_tokens / max(h.capacity_tokens, 1)
    yield "backup_tokens", COUNTER, "Tokens queued for backup to the host", {}, h.backup_tokens
    yield "load_backs", COUNTER, "Load-backs from the host queued", {}, h.load_backs
    yield "load_back_tokens", COUNTER, "Tokens of the load-backs", {}, h.load_back_tokens
    pend = "Nodes awaiting a transfer ack"
    yield "transfer_pending_nodes", GAUGE, pend, {"direction": "d2h"}, h.pending_writes
    yield "transfer_pending_nodes", GAUGE, pend, {"direction": "h2d"}, h.pending_loads


def _component_rows(s: CacheStats) -> Iterator[Row]:
    """A hybrid model's recurrent states and SWA tombstones (``HybridCacheStats``)."""
    c = getattr(s, "components", None)
    if c is None:
        return
    held, events = "Recurrent states held, by tier", "Recurrent states by what happened to them"
    yield "recurrent_states", GAUGE, held, {"tier": "device"}, c.states_held
    hits = "Matches served from a recurrent state, by the tier it was in"
    yield "recurrent_state_hits", COUNTER, hits, {"tier": "device"}, c.state_hits
    for event, value in (("stored", c.states_stored), ("evicted", c.states_evicted)):
        yield "recurrent_state_events", COUNTER, events, {"tier": "device", "event": event}, value
    swa = "SWA KV tokens freed (tombstoned) outside every window"
    yield "swa_tombstoned_tokens", GAUGE, swa + ", now", {}, c.swa_tombstoned_tokens
    yield "swa_tombstones", COUNTER, swa + ", ever", {}, c.swa_tombstoned_total
    h = getattr(s, "host_components", None)
    if h is None:
        return
    host = {"tier": "host"}
    yield "recurrent_states", GAUGE, held, host, h.host_states_held
    yield (
        "recurrent_state_capacity",
        GAUGE,
        "Recurrent state slots, by tier",
        host,
        h.host_state_capacity,
    )
    yield "recurrent_state_hits", COUNTER, hits, host, h.states_loaded
    for event, value in (
        ("backed_up", h.states_backed_up),
        ("loaded", h.states_loaded),
        ("evicted", h.host_states_evicted),
    ):
        yield "recurrent_state_events", COUNTER, events, {**host, "event": event}, value
    for event, value in (("stored", h.states_stored), ("loaded", h.states_fetched)):
        yield "recurrent_state_events", COUNTER, events, {"tier": "storage", "event": event}, value


def _transfer_rows(s: CacheStats) -> Iterator[Row]:
    t = s.transfer
    if t is None:
        return
    per_direction: list[tuple[str, str, str, float | Durations, float | Durations]] = [
        ("transfer_bytes", COUNTER, "KV bytes moved", t.h2d_bytes, t.d2h_bytes),
        ("transfer_seconds", COUNTER, "Busy time of done batches", t.h2d_seconds, t.d2h_seconds),
        ("transfer_batches", COUNTER, "Batches issued", t.load_batches, t.write_batches),
        (
            "transfer_queue_tokens",
            GAUGE,
            "Tokens queued",
            t.load_queue_tokens,
            t.write_queue_tokens,
        ),
        (
            "transfer_inflight_batches",
            GAUGE,
            "Batches unacked",
            t.loads_in_flight,
            t.writes_in_flight,
        ),
        (
            "transfer_duration_seconds",
            HISTOGRAM,
            "Busy time of each batch: h2d a load-back, d2h a backup",
            t.h2d_batch_seconds,
            t.d2h_batch_seconds,
        ),
    ]
    for name, kind, doc, h2d, d2h in per_direction:
        yield name, kind, doc, {"direction": "h2d"}, h2d
        yield name, kind, doc, {"direction": "d2h"}, d2h
    yield "load_layer_waits", COUNTER, "Layer reads that waited on a load", {}, t.layer_waits
    yield "transfer_blocking_waits", COUNTER, "CPU waits on transfers", {}, t.blocking_waits
    yield "integrity_failures", COUNTER, "Corrupt host pages at load", {}, t.integrity_failures


def _storage_rows(s: CacheStats) -> Iterator[Row]:
    st = s.storage
    if st is None:
        return
    b = {"backend": st.backend}
    counters = [  # name, help, value
        ("storage_queries", "Storage existence queries", st.queries),
        ("storage_query_pages", "Pages the queries asked about", st.query_pages),
        ("storage_hit_pages", "Pages storage reported present", st.hit_pages),
        ("storage_prefetches", "Prefetches started", st.prefetches),
        ("storage_prefetch_revoked", "Prefetches ended by a short hit", st.prefetch_revoked),
        (
            "storage_prefetch_skipped",
            "Prefetches slower than recompute",
            st.prefetch_skipped_slower,
        ),
        ("storage_prefetch_loaded_tokens", "Tokens prefetches inserted", st.prefetch_loaded_tokens),
        ("storage_backup_pages", "Pages written to storage", st.backup_pages),
        ("storage_eviction_write_pages", "Pages written on host eviction", st.eviction_write_pages),
        ("storage_eviction_dropped_pages", "Pages lost: write failed", st.eviction_dropped_pages),
        ("storage_failures", "Failed or refused storage calls", st.failures),
    ]
    for name, doc, value in counters:
        yield name, COUNTER, doc, b, value
    pend = "Storage operations in flight"
    yield "storage_pending", GAUGE, pend, {**b, "kind": "prefetch"}, st.pending_prefetches
    yield "storage_pending", GAUGE, pend, {**b, "kind": "backup"}, st.pending_backups
    moved, busy = "Storage bytes moved", "Busy time of storage calls"
    yield "storage_bytes", COUNTER, moved, {**b, "direction": "read"}, st.bytes_read
    yield "storage_bytes", COUNTER, moved, {**b, "direction": "write"}, st.bytes_written
    yield "storage_seconds", COUNTER, busy, {**b, "direction": "read"}, st.read_seconds
    yield "storage_seconds", COUNTER, busy, {**b, "direction": "write"}, st.write_seconds
    calls = "Duration of each backend call"
    for op, hist in (
        ("exists", st.exists_call_seconds),
        ("get", st.get_call_seconds),
        ("set", st.set_call_seconds),
    ):
        yield "storage_call_duration_seconds", HISTOGRAM, calls, {**b, "op": op}, hist
    faults = "Storage faults by kind (io_<ERRNO>, corrupt_object, backend_error, slow_call, ...)"
    for kind, count in sorted(st.faults.items()):
        yield "storage_faults", COUNTER, faults, {**b, "kind": kind}, count
    yield from _storage_usage_rows(s)
    yield from _breaker_rows(s)


def _storage_usage_rows(s: CacheStats) -> Iterator[Row]:
    st = s.storage
    assert st is not None
    b = {"backend": st.backend}
    if st.used_bytes is not None:
        used = "Bytes in the store (as of the last write)"
        yield "storage_used_bytes", GAUGE, used, b, st.used_bytes
    if st.capacity_bytes is not None:
        yield "storage_capacity_bytes", GAUGE, "The store's byte cap", b, st.capacity_bytes
    if st.used_bytes is not None and st.capacity_bytes:
        ratio = st.used_bytes / st.capacity_bytes
        yield "usage_ratio", GAUGE, _USAGE, {"tier": "storage"}, ratio


def _breaker_rows(s: CacheStats) -> Iterator[Row]:
    st = s.storage
    assert st is not None
    if st.breaker_state not in BREAKER_STATES:  # no breaker
        return
    b = {"backend": st.backend}
    doc = "Circuit breaker: 0 closed, 1 open, 2 half_open (label state names it)"
    code = BREAKER_STATES.index(st.breaker_state)
    yield "storage_breaker_state", GAUGE, doc, {**b, "state": st.breaker_state}, code
    yield "storage_breaker_trips", COUNTER, "Times the breaker opened", b, st.breaker_trips
