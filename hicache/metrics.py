"""Prometheus metrics of a cache: a collector that reads ``cache.stats()`` at scrape time.

Nothing runs on the cache's paths but its counters (``radix.stats``) and duration histograms
(``hicache.durations``: a ``perf_counter`` pair and a bucket increment per load-back batch,
backup batch, eviction pass and storage call); each scrape turns one snapshot into metric
families. Needs ``prometheus_client`` (``pip install 'hicache[metrics]'``); importing this
module does not. ``MetricsServer`` serves them over HTTP, on 127.0.0.1 unless told otherwise.

Metrics (``prefix`` ``hicache`` by default; counters end in ``_total``; ``naming="sglang"``
exports the rows of ``metric_rows.SGLANG_NAMES`` under SGLang's ``sglang:`` names instead):

======================================== ========= ====================================
name                                     type      labels
======================================== ========= ====================================
``match_calls_total``                    counter
``prefix_query_tokens_total``            counter
``cache_hit_tokens_total``               counter   ``tier`` = ``device`` | ``host``
``insert_calls_total``                   counter
``inserted_tokens_total``                counter
``evicted_tokens_total``                 counter   ``tier``
``tokens``                               gauge     ``tier``, ``state`` = ``evictable`` |
                                                   ``protected`` (device) | ``cached`` (host)
``capacity_tokens``                      gauge     ``tier``
``free_tokens``                          gauge     ``tier`` = ``device``
``usage_ratio``                          gauge     ``tier`` = ``device`` | ``host`` | ``storage``
``eviction_duration_seconds``            histogram ``tier`` = ``device``
``backup_tokens_total``                  counter
``load_backs_total``                     counter
``load_back_tokens_total``               counter
``transfer_pending_nodes``               gauge     ``direction`` = ``d2h`` | ``h2d``
``transfer_bytes_total``                 counter   ``direction``
``transfer_seconds_total``               counter   ``direction``
``transfer_batches_total``               counter   ``direction``
``transfer_queue_tokens``                gauge     ``direction``
``transfer_inflight_batches``            gauge     ``direction``
``transfer_duration_seconds``            histogram ``direction`` (h2d: load-back, d2h: backup)
``load_layer_waits_total``               counter
``transfer_blocking_waits_total``        counter
``integrity_failures_total``             counter
``storage_queries_total``                counter   ``backend`` (every ``storage_*`` row)
``storage_query_pages_total``            counter
``storage_hit_pages_total``              counter
``storage_prefetches_total``             counter
``storage_prefetch_revoked_total``       counter
``storage_prefetch_skipped_total``       counter
``storage_prefetch_loaded_tokens_total`` counter
``storage_backup_pages_total``           counter
``storage_eviction_write_pages_total``   counter   (exclusive tiering: written on host eviction)
``storage_eviction_dropped_pages_total`` counter   (exclusive: evicted after a failed write)
``storage_pending``                      gauge     ``kind`` = ``prefetch`` | ``backup``
``storage_bytes_total``                  counter   ``direction`` = ``read`` | ``write``
``storage_seconds_total``                counter   ``direction``
``storage_call_duration_seconds``        histogram ``op`` = ``exists`` | ``get`` | ``set``
``storage_used_bytes``                   gauge     (backends that report it: file, memory)
``storage_capacity_bytes``               gauge     (file)
``storage_failures_total``               counter
``storage_faults_total``                 counter   ``kind`` (``backends.faults``)
``storage_breaker_state``                gauge     ``state``; 0 closed, 1 open, 2 half_open
``storage_breaker_trips_total``          counter   (both only with a breaker)
======================================== ========= ====================================

Host and transfer metrics appear only for a cache with a host tier, storage metrics only for
one with a storage tier. ``storage_prefetch_skipped_total`` counts the prefetches not loaded
because loading would be slower than recomputing. Histogram buckets: ``durations.BUCKETS_S``.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

from hicache.checks import check_choice, check_int
from hicache.durations import Durations
from hicache.metric_rows import COUNTER, GAUGE, rows, sglang_row
from hicache.radix.base import BasePrefixCache

NAMINGS = ("hicache", "sglang")
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_RESERVED = {"tier", "state", "direction", "backend", "kind", "op", "cache_source", "pool"}


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
    labels : constant labels on every sample (e.g. ``{"model": "llama"}``); none of the
        labels the metrics use themselves (``tier``, ``state``, ``direction``, ``backend``,
        ``kind``, ``op``, ``cache_source``, ``pool``).
    naming : ``hicache`` (every name ``{prefix}_...``) or ``sglang``: the series SGLang
        exports too get SGLang's name and labels (``sglang:load_back_duration_seconds``, ...;
        ``metric_rows.SGLANG_NAMES``), the others keep ours.

    ``TypeError``/``ValueError`` on a bad argument (nothing registered), ``ImportError``
    without prometheus_client.
    """

    def __init__(
        self,
        cache: BasePrefixCache,
        registry: Any = None,
        prefix: str = "hicache",
        labels: Mapping[str, str] | None = None,
        naming: str = "hicache",
    ) -> None:
        if not isinstance(cache, BasePrefixCache):
            raise TypeError(f"cache must be a RadixCache or HiRadixCache, got {type(cache)}")
        if not isinstance(prefix, str) or not _NAME.match(prefix):
            raise ValueError(f"prefix must be a Prometheus name like 'hicache', got {prefix!r}")
        self.labels = _check_labels(labels)
        self.naming = check_choice("naming", naming, NAMINGS)
        prom = _prometheus()
        self.cache, self.prefix = cache, prefix
        self.registry = prom.REGISTRY if registry is None else registry
        self._prom = prom
        self.registry.register(self)

    def collect(self) -> Iterator[Any]:
        """One metric family per name, from one ``cache.stats()`` snapshot."""
        families: dict[str, Any] = {}
        for name, kind, doc, labels, value in rows(self.cache.stats()):
            full, labels = self._name(name, labels)
            family = families.get(full)
            if family is None:
                family = families[full] = self._family(kind, full, doc, list(labels))
            if isinstance(value, Durations):
                go = self._prom.utils.floatToGoString
                buckets = [(go(bound), n) for bound, n in value.cumulative()]
                family.add_metric(list(labels.values()), buckets, value.sum_s)
            else:
                family.add_metric(list(labels.values()), value)
        yield from families.values()

    def _name(self, name: str, labels: dict[str, str]) -> tuple[str, dict[str, str]]:
        theirs = sglang_row(name, labels) if self.naming == "sglang" else None
        if theirs is not None:
            return f"sglang:{theirs[0]}", {**self.labels, **theirs[1]}
        return f"{self.prefix}_{name}", {**self.labels, **labels}

    def _family(self, kind: str, name: str, doc: str, labels: list[str]) -> Any:
        core = self._prom.core
        make = {
            COUNTER: core.CounterMetricFamily,
            GAUGE: core.GaugeMetricFamily,
        }.get(kind, core.HistogramMetricFamily)
        return make(name, doc, labels=labels)

    def close(self) -> None:
        """Unregister from the registry."""
        self.registry.unregister(self)


class MetricsServer:
    """``PrometheusExporter(cache, **kwargs)`` served on ``http://host:port/metrics`` from a
    daemon thread (``prometheus_client.start_http_server``) until ``close`` (or the end of a
    ``with`` block). ``port`` 0: a free port, read back as ``port``. ``host`` defaults to the
    loopback address; ``0.0.0.0`` (or an interface's address) exposes the metrics to the
    network. ``TypeError``/``ValueError`` on a bad argument, ``OSError`` when the port is taken
    (nothing left registered either way)."""

    def __init__(
        self, cache: BasePrefixCache, port: int = 0, host: str = "127.0.0.1", **kwargs: Any
    ) -> None:
        check_endpoint(port, host)
        self.exporter = PrometheusExporter(cache, **kwargs)
        try:
            self._server, self._thread = _prometheus().start_http_server(
                port, host, registry=self.exporter.registry
            )
        except BaseException:
            self.exporter.close()
            raise
        self.host, self.port = host, int(self._server.server_port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving, free the port and unregister the exporter."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self.exporter.close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_http_server(
    cache: BasePrefixCache, port: int, addr: str = "127.0.0.1", **kwargs: Any
) -> MetricsServer:
    """``MetricsServer(cache, port, addr, **kwargs)`` (the name ``prometheus_client`` uses)."""
    return MetricsServer(cache, port, addr, **kwargs)


def check_endpoint(port: object, host: object) -> None:
    """``TypeError``/``ValueError`` unless ``port`` is an int in [0, 65535] and ``host`` a
    non-empty str; ``ValueError`` when prometheus_client is not installed."""
    if check_int("metrics port", port, minimum=0) > 65535:
        raise ValueError(f"metrics port must be <= 65535, got {port}")
    if not isinstance(host, str) or not host:
        raise TypeError(f"metrics host must be a non-empty str, got {host!r}")
    try:
        _prometheus()
    except ImportError as err:
        raise ValueError(f"--metrics-port: {err}") from err


def add_metrics_flags(p: argparse.ArgumentParser) -> None:
    """``--metrics-port`` and ``--metrics-host`` (the commands that run a cache)."""
    p.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics of the running cache on this port while it runs "
        "(0: a free one; needs hicache[metrics]; default: none)",
    )
    p.add_argument(
        "--metrics-host",
        help="the address the metrics server binds (default 127.0.0.1; 0.0.0.0: every interface)",
    )


def serving(
    cache: BasePrefixCache, port: int | None, host: str, labels: Mapping[str, str]
) -> contextlib.AbstractContextManager[MetricsServer | None]:
    """For the commands: a ``MetricsServer`` of ``cache`` with ``labels`` on its own registry,
    its URL told on stderr; with ``port`` None, nothing."""
    if port is None:
        return contextlib.nullcontext()
    registry = _prometheus().CollectorRegistry()
    server = MetricsServer(cache, port, host, registry=registry, labels=labels)
    sys.stderr.write(f"metrics: {server.url} ({', '.join(labels.values())})\n")
    return server


def _check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    if labels is not None and not isinstance(labels, Mapping):
        raise TypeError(f"labels must be a mapping of str to str, got {type(labels).__name__}")
    out = dict(labels or {})
    for key, value in out.items():
        if not isinstance(key, str) or not _NAME.match(key) or key in _RESERVED:
            raise ValueError(f"labels: {key!r} is not a free label name")
        if not isinstance(value, str):
            raise TypeError(f"labels[{key!r}] must be a str, got {type(value).__name__}")
    return out
