"""Prometheus metrics of a cache: a collector that reads ``cache.stats()`` at scrape time.

Nothing runs on the cache's paths: the cache keeps its counters always (``radix.stats``) and
each scrape turns one snapshot into metric families. Needs ``prometheus_client``
(``pip install 'hicache[metrics]'``); importing this module does not.

Metrics (``prefix`` ``hicache`` by default; counters end in ``_total``):

======================================== ======= ====================================
name                                     type    labels
======================================== ======= ====================================
``match_calls_total``                    counter
``prefix_query_tokens_total``            counter
``cache_hit_tokens_total``               counter ``tier`` = ``device`` | ``host``
``insert_calls_total``                   counter
``inserted_tokens_total``                counter
``evicted_tokens_total``                 counter ``tier``
``tokens``                               gauge   ``tier``, ``state`` = ``evictable`` | ``protected``
                                                 (device) | ``cached`` (host)
``capacity_tokens``                      gauge   ``tier``
``backup_tokens_total``                  counter
``load_backs_total``                     counter
``load_back_tokens_total``               counter
``transfer_pending_nodes``               gauge   ``direction`` = ``d2h`` | ``h2d``
``transfer_bytes_total``                 counter ``direction``
``transfer_seconds_total``               counter ``direction``
``transfer_batches_total``               counter ``direction``
``transfer_queue_tokens``                gauge   ``direction``
``transfer_inflight_batches``            gauge   ``direction``
``load_layer_waits_total``               counter
``transfer_blocking_waits_total``        counter
``integrity_failures_total``             counter
``storage_queries_total``                counter ``backend`` (every ``storage_*`` row)
``storage_query_pages_total``            counter
``storage_hit_pages_total``              counter
``storage_prefetches_total``             counter
``storage_prefetch_revoked_total``       counter
``storage_prefetch_skipped_total``       counter
``storage_prefetch_loaded_tokens_total`` counter
``storage_backup_pages_total``           counter
``storage_pending``                      gauge   ``kind`` = ``prefetch`` | ``backup``
``storage_bytes_total``                  counter ``direction`` = ``read`` | ``write``
``storage_seconds_total``                counter ``direction``
``storage_failures_total``               counter
``storage_breaker_state``                gauge   ``state`` = ``closed`` | ``open`` | ``half_open``
                                                 (1: the breaker's state; all 0: none)
======================================== ======= ====================================

Host and transfer metrics appear only for a cache with a host tier, storage metrics only for
one with a storage tier. ``d2h`` is a backup to the host, ``h2d`` a load-back; storage
``read`` is a prefetch, ``write`` a backup; ``storage_prefetch_skipped_total`` counts the
prefetches not loaded because loading would be slower than recomputing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

from hicache.radix.base import BasePrefixCache
from hicache.radix.stats import CacheStats

Row = tuple[str, str, str, dict[str, str], float]  # name, kind, help, labels, value
COUNTER, GAUGE = "counter", "gauge"
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_RESERVED = {"tier", "state", "direction", "backend", "kind"}
BREAKER_STATES = ("closed", "open", "half_open")


def _prometheus() -> ModuleType:
    try:
        import prometheus_client
        import prometheus_client.core
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "hicache.metrics needs prometheus_client: pip install 'hicache[metrics]'"
        ) from err
    return prometheus_client


class PrometheusExporter:
    """A Prometheus collector over ``cache.stats()``, registered on ``registry``.

    Parameters
    ----------
    cache : the ``RadixCache`` or ``HiRadixCache`` to export.
    registry : a ``prometheus_client.CollectorRegistry``; None: the default ``REGISTRY``.
    prefix : metric name prefix (a Prometheus name: letters, digits, ``_``). Two exporters on
        one registry need different prefixes (the registry refuses duplicated names).
    labels : constant labels on every sample (e.g. ``{"model": "llama"}``); not ``tier``,
        ``state``, ``direction``, ``backend`` or ``kind``.

    ``TypeError``/``ValueError`` on a bad argument (nothing registered), ``ImportError``
    without prometheus_client.
    """

    def __init__(
        self,
        cache: BasePrefixCache,
        registry: Any = None,
        prefix: str = "hicache",
        labels: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(cache, BasePrefixCache):
            raise TypeError(f"cache must be a RadixCache or HiRadixCache, got {type(cache)}")
        if not isinstance(prefix, str) or not _NAME.match(prefix):
            raise ValueError(f"prefix must be a Prometheus name like 'hicache', got {prefix!r}")
        self.labels = _check_labels(labels)
        prom = _prometheus()
        self.cache, self.prefix = cache, prefix
        self.registry = prom.REGISTRY if registry is None else registry
        self._families = prom.core
        self.registry.register(self)

    def collect(self) -> Iterator[Any]:
        """One metric family per name, from one ``cache.stats()`` snapshot."""
        families: dict[str, Any] = {}
        for name, kind, doc, labels, value in rows(self.cache.stats()):
            labels = {**self.labels, **labels}
            family = families.get(name)
            if family is None:
                core = self._families
                make = core.CounterMetricFamily if kind == COUNTER else core.GaugeMetricFamily
                family = families[name] = make(f"{self.prefix}_{name}", doc, labels=list(labels))
            family.add_metric(list(labels.values()), value)
        yield from families.values()

    def close(self) -> None:
        """Unregister from the registry."""
        self.registry.unregister(self)


def start_http_server(
    cache: BasePrefixCache, port: int, addr: str = "0.0.0.0", **kwargs: Any
) -> PrometheusExporter:
    """Export ``cache`` (``PrometheusExporter(cache, **kwargs)``) and serve its registry on
    ``addr:port`` from a daemon thread (``prometheus_client.start_http_server``)."""
    exporter = PrometheusExporter(cache, **kwargs)
    _prometheus().start_http_server(port, addr, registry=exporter.registry)
    return exporter


def _check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    out = dict(labels or {})
    for key, value in out.items():
        if not isinstance(key, str) or not _NAME.match(key) or key in _RESERVED:
            raise ValueError(f"labels: {key!r} is not a free label name")
        if not isinstance(value, str):
            raise TypeError(f"labels[{key!r}] must be a str, got {type(value).__name__}")
    return out


def rows(s: CacheStats) -> Iterator[Row]:
    """Every sample of ``s``: (name without prefix, kind, help, labels, value)."""
    p, d = s.prefix, s.device
    yield "match_calls", COUNTER, "match_prefix calls", {}, p.match_calls
    yield "prefix_query_tokens", COUNTER, "Tokens looked up by match_prefix", {}, p.query_tokens
    hit = "Tokens match_prefix found, by tier"
    yield "cache_hit_tokens", COUNTER, hit, {"tier": "device"}, p.device_hit_tokens
    if s.host is not None:
        yield "cache_hit_tokens", COUNTER, hit, {"tier": "host"}, p.host_hit_tokens
    yield "insert_calls", COUNTER, "insert and cache_*_req calls", {}, p.insert_calls
    yield "inserted_tokens", COUNTER, "Tokens added to the cache", {}, p.inserted_tokens
    yield "evicted_tokens", COUNTER, "Tokens evicted, by tier", {"tier": "device"}, d.evicted_tokens
    size = "Cached tokens, by tier and state"
    yield "tokens", GAUGE, size, {"tier": "device", "state": "evictable"}, d.evictable_tokens
    yield "tokens", GAUGE, size, {"tier": "device", "state": "protected"}, d.protected_tokens
    if d.capacity_tokens is not None:
        yield (
            "capacity_tokens",
            GAUGE,
            "Token slots, by tier",
            {"tier": "device"},
            d.capacity_tokens,
        )
    yield from _host_rows(s)
    yield from _transfer_rows(s)
    yield from _storage_rows(s)


def _host_rows(s: CacheStats) -> Iterator[Row]:
    h = s.host
    if h is None:
        return
    yield "evicted_tokens", COUNTER, "Tokens evicted, by tier", {"tier": "host"}, h.evicted_tokens
    size = "Cached tokens, by tier and state"
    yield "tokens", GAUGE, size, {"tier": "host", "state": "cached"}, h.size_tokens
    yield "capacity_tokens", GAUGE, "Token slots, by tier", {"tier": "host"}, h.capacity_tokens
    yield "backup_tokens", COUNTER, "Tokens queued for backup to the host", {}, h.backup_tokens
    yield "load_backs", COUNTER, "Load-backs from the host queued", {}, h.load_backs
    yield "load_back_tokens", COUNTER, "Tokens of the load-backs", {}, h.load_back_tokens
    pend = "Nodes awaiting a transfer ack"
    yield "transfer_pending_nodes", GAUGE, pend, {"direction": "d2h"}, h.pending_writes
    yield "transfer_pending_nodes", GAUGE, pend, {"direction": "h2d"}, h.pending_loads


def _transfer_rows(s: CacheStats) -> Iterator[Row]:
    t = s.transfer
    if t is None:
        return
    per_direction = [  # name, kind, help, h2d, d2h
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
    breaker = "Circuit breaker state (1: current)"
    for state in BREAKER_STATES:
        on = float(st.breaker_state == state)
        yield "storage_breaker_state", GAUGE, breaker, {**b, "state": state}, on
