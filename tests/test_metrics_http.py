"""The exporter scraped over HTTP after a workload with host and storage tiers and evictions:
duration histograms, usage gauges and the breaker present with sane values; SGLang's names."""

from __future__ import annotations

import errno
import os
import urllib.request
from typing import Any

import psutil
import pytest
import torch

from hicache.backends import StorageConfig, file_lru
from hicache.backends.file import HiCacheFile
from hicache.backends.memory import MemoryStorage
from hicache.metrics import MetricsServer, PrometheusExporter, start_http_server
from hicache.radix import HiCacheConfig
from hicache.stack import build_kv_stack

from .radix.hiradix_rig import load_all, put

prometheus_client = pytest.importorskip("prometheus_client")
parser = pytest.importorskip("prometheus_client.parser")

PAGE, SEQ = 2, 8
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class BrokenWrites(MemoryStorage):
    """Every write raises: the guard turns it into a miss and its breaker opens."""

    def batch_set_v1(self, keys, host_indices, extra_info=None):  # type: ignore[no-untyped-def]
        raise OSError("disk on fire")


def _cache(backend: Any) -> Any:
    """A HiRadixCache: 16 device slots, 64 host slots, storage ``backend`` (an instance: it
    gets a circuit breaker)."""
    storage = StorageConfig(backend=backend)
    hicache = HiCacheConfig(hicache_ratio=4, load_back_threshold=1, storage=storage)
    stack = build_kv_stack(
        layer_num=2,
        head_num=2,
        head_dim=4,
        dtype=torch.float32,
        size=16,
        max_requests=2,
        max_context_len=64,
        page_size=PAGE,
        hicache=hicache,
    )
    return stack.cache


def _workload(cache: Any) -> None:
    """Four 8-token prompts through a 16-slot device tier (evictions to the host, backups to
    storage), then the first one loaded back from the host."""
    prompts = [list(range(100 * i + 1, 100 * i + 1 + SEQ)) for i in range(4)]
    for tokens in prompts:
        if cache.token_to_kv_pool_allocator.available_size() < SEQ:
            assert cache.evict(SEQ) >= SEQ
        put(cache, tokens)
        cache.drain_transfers()
        cache.check_hicache_events()
    load_all(cache, prompts[0])
    cache.drain_transfers()
    cache.check_hicache_events()


def _parse(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
    }


def _get(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as response:
        return _parse(response.read().decode())


def _value(got: Samples, name: str, **labels: str) -> float:
    return got[(name, tuple(sorted(labels.items())))]


def _histogram(got: Samples, name: str, **labels: str) -> tuple[float, list[float]]:
    """(``_count``, the cumulative ``_bucket`` values in ``le`` order) of one histogram."""
    buckets = sorted(
        (float(dict(lab)["le"]), v)
        for (n, lab), v in got.items()
        if n == f"{name}_bucket" and {k: x for k, x in lab if k != "le"} == labels
    )
    return _value(got, f"{name}_count", **labels), [v for _, v in buckets]


def test_scrape_over_http_shows_histograms_usage_and_breaker(tmp_path) -> None:
    cache = _cache(HiCacheFile(tmp_path, max_bytes=1 << 20))
    _workload(cache)
    registry = prometheus_client.CollectorRegistry()
    with MetricsServer(cache, 0, registry=registry, labels={"model": "tiny"}) as server:
        got = _get(server.url)
    s = cache.stats()
    st = s.storage
    assert st is not None and st.backup_pages > 0 and s.device.evicted_tokens >= 3 * SEQ
    for name, labels in [
        ("hicache_transfer_duration_seconds", {"direction": "h2d"}),
        ("hicache_transfer_duration_seconds", {"direction": "d2h"}),
        ("hicache_eviction_duration_seconds", {"tier": "device"}),
        ("hicache_storage_call_duration_seconds", {"backend": st.backend, "op": "set"}),
    ]:
        count, buckets = _histogram(got, name, model="tiny", **labels)
        assert count > 0 and buckets == sorted(buckets) and buckets[-1] == count, name
    loads, _ = _histogram(got, "hicache_transfer_duration_seconds", model="tiny", direction="h2d")
    assert loads == s.transfer.load_batches  # type: ignore[union-attr]
    evictions, _ = _histogram(got, "hicache_eviction_duration_seconds", model="tiny", tier="device")
    assert evictions == s.device.eviction_seconds.count >= 3
    usage = {
        t: _value(got, "hicache_usage_ratio", model="tiny", tier=t)
        for t in ("device", "host", "storage")
    }
    assert all(0 < u <= 1 for u in usage.values()), usage
    assert usage["host"] == s.host.size_tokens / s.host.capacity_tokens  # type: ignore[union-attr]
    used = _value(got, "hicache_storage_used_bytes", model="tiny", backend=st.backend)
    assert used == st.used_bytes >= st.bytes_written > 0
    assert (
        _value(got, "hicache_storage_capacity_bytes", model="tiny", backend=st.backend) == 1 << 20
    )
    closed = _value(
        got, "hicache_storage_breaker_state", model="tiny", backend=st.backend, state="closed"
    )
    trips = _value(got, "hicache_storage_breaker_trips_total", model="tiny", backend=st.backend)
    assert (closed, trips) == (0, 0)


def test_an_open_breaker_reads_1_with_its_trips() -> None:
    cache = _cache(BrokenWrites())
    _workload(cache)
    registry = prometheus_client.CollectorRegistry()
    PrometheusExporter(cache, registry)
    got = _parse(prometheus_client.generate_latest(registry).decode())
    backend = "BrokenWrites"
    assert _value(got, "hicache_storage_breaker_state", backend=backend, state="open") == 1
    assert _value(got, "hicache_storage_breaker_trips_total", backend=backend) >= 1
    count, _ = _histogram(got, "hicache_storage_call_duration_seconds", backend=backend, op="set")
    assert count >= 3  # the failed writes that opened it were timed too
    trips = _value(got, "hicache_storage_breaker_trips_total", backend=backend)
    for kind, least in (("backend_error", 3), ("breaker_trip", trips)):
        assert _value(got, "hicache_storage_faults_total", backend=backend, kind=kind) >= least
    assert (
        _value(got, "hicache_storage_faults_total", backend=backend, kind="breaker_trip") == trips
    )


def test_file_store_faults_are_scraped_by_kind(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real_open = os.open

    def read_only(path, flags, *args, **kw):  # type: ignore[no-untyped-def]
        if flags & os.O_CREAT:  # the writer's temporaries: a read-only file system
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(file_lru.os, "open", read_only)
    cache = _cache(HiCacheFile(tmp_path))
    _workload(cache)
    registry = prometheus_client.CollectorRegistry()
    PrometheusExporter(cache, registry)
    got = _parse(prometheus_client.generate_latest(registry).decode())
    st = cache.stats().storage
    assert st is not None and st.failures > 0 and st.faults["io_EROFS"] > 0
    scraped = _value(got, "hicache_storage_faults_total", backend=st.backend, kind="io_EROFS")
    assert scraped == st.faults["io_EROFS"]


def test_sglang_naming_renames_the_shared_series_only(tmp_path) -> None:
    cache = _cache(HiCacheFile(tmp_path))
    _workload(cache)
    ours, theirs = prometheus_client.CollectorRegistry(), prometheus_client.CollectorRegistry()
    PrometheusExporter(cache, ours)
    PrometheusExporter(cache, theirs, naming="sglang")
    a = _parse(prometheus_client.generate_latest(ours).decode())
    b = _parse(prometheus_client.generate_latest(theirs).decode())
    same = [  # (ours, SGLang's, SGLang's labels for ours)
        (
            "hicache_transfer_duration_seconds_count",
            "sglang:load_back_duration_seconds_count",
            {"direction": "h2d"},
            {},
        ),
        (
            "hicache_transfer_duration_seconds_count",
            "sglang:hicache_backup_duration_seconds_count",
            {"direction": "d2h"},
            {},
        ),
        (
            "hicache_eviction_duration_seconds_count",
            "sglang:eviction_duration_seconds_count",
            {"tier": "device"},
            {},
        ),
        (
            "hicache_cache_hit_tokens_total",
            "sglang:cached_tokens_total",
            {"tier": "host"},
            {"cache_source": "host"},
        ),
        ("hicache_evicted_tokens_total", "sglang:evicted_tokens_total", {"tier": "device"}, {}),
        ("hicache_capacity_tokens", "sglang:hicache_host_total_tokens", {"tier": "host"}, {}),
        ("hicache_load_back_tokens_total", "sglang:load_back_tokens_total", {}, {"pool": "kv"}),
        (
            "hicache_transfer_bytes_total",
            "sglang:hicache_backup_bytes_total",
            {"direction": "d2h"},
            {},
        ),
    ]
    for mine, sglang, my_labels, their_labels in same:
        assert _value(a, mine, **my_labels) == _value(b, sglang, **their_labels) > 0, sglang
        assert (mine, tuple(sorted(my_labels.items()))) not in b
    assert _value(b, "hicache_match_calls_total") == _value(a, "hicache_match_calls_total") > 0
    assert ("hicache_evicted_tokens_total", (("tier", "host"),)) in b  # no SGLang series
    with pytest.raises(ValueError, match="naming"):
        PrometheusExporter(cache, prometheus_client.CollectorRegistry(), naming="vllm")


def _listening(port: int) -> list[str]:
    return [
        c.laddr.ip
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    ]


def test_the_server_binds_loopback_unless_told_otherwise() -> None:
    cache = _cache(MemoryStorage())
    server = start_http_server(cache, 0, registry=prometheus_client.CollectorRegistry())
    try:
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        assert _listening(server.port) == ["127.0.0.1"]
        assert _get(server.url)[("hicache_match_calls_total", ())] == 0
    finally:
        server.close()
    assert _listening(server.port) == []
    registry = prometheus_client.CollectorRegistry()
    with MetricsServer(cache, 0, host="0.0.0.0", registry=registry) as everywhere:
        assert _listening(everywhere.port) == ["0.0.0.0"]


@pytest.mark.parametrize(
    ("port", "host", "error"),
    [
        (-1, "127.0.0.1", ValueError),
        (70000, "127.0.0.1", ValueError),
        ("9400", "127.0.0.1", TypeError),
        (0, "", TypeError),
    ],
)
def test_bad_endpoints_raise_before_registering(port, host, error) -> None:  # type: ignore[no-untyped-def]
    registry = prometheus_client.CollectorRegistry()
    with pytest.raises(error, match="metrics"):
        MetricsServer(_cache(MemoryStorage()), port, host, registry=registry)
    assert not _parse(prometheus_client.generate_latest(registry).decode())
