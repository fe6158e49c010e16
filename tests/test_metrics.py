"""The Prometheus exporter: a scrape after a small run shows that run's figures."""

from __future__ import annotations

import pytest

from hicache.metrics import PrometheusExporter
from hicache.radix import RadixCache, RadixKey

from .radix.hiradix_rig import make_cache, put

prometheus_client = pytest.importorskip("prometheus_client")
parser = pytest.importorskip("prometheus_client.parser")


def _scrape(registry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = prometheus_client.generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
    }


def _small_run():
    """Insert 8 tokens (backed up), demote them, match them back (a host hit), load them."""
    cache = make_cache(page_size=2)
    tokens = list(range(1, 9))
    put(cache, tokens)
    assert cache.evict(8) == 8
    m = cache.match_prefix(RadixKey(tokens))
    cache.init_load_back(m.last_host_node, m.host_hit_length)
    cache.ready_to_load_host_cache()
    cache.check_hicache_events()
    return cache


def test_scrape_shows_the_figures_of_a_small_run() -> None:
    registry = prometheus_client.CollectorRegistry()
    cache = _small_run()
    PrometheusExporter(cache, registry, labels={"model": "tiny"})
    got = _scrape(registry)
    t = cache.stats().transfer
    assert t is not None and t.h2d_bytes == t.d2h_bytes > 0

    def at(name: str, **labels: str) -> float:
        return got[(f"hicache_{name}", tuple(sorted({"model": "tiny", **labels}.items())))]

    assert at("match_calls_total") == 1 and at("prefix_query_tokens_total") == 8
    assert at("cache_hit_tokens_total", tier="device") == 0
    assert at("cache_hit_tokens_total", tier="host") == 8
    assert at("inserted_tokens_total") == 8 and at("backup_tokens_total") == 8
    assert at("evicted_tokens_total", tier="device") == 8
    assert at("evicted_tokens_total", tier="host") == 0
    assert at("load_backs_total") == 1 and at("load_back_tokens_total") == 8
    assert at("tokens", tier="device", state="evictable") == 8
    assert at("tokens", tier="host", state="cached") == 8
    assert at("capacity_tokens", tier="device") == 32
    assert at("transfer_bytes_total", direction="h2d") == t.h2d_bytes
    assert at("transfer_bytes_total", direction="d2h") == t.d2h_bytes
    assert at("transfer_batches_total", direction="h2d") == 1
    assert at("transfer_seconds_total", direction="d2h") > 0
    assert at("transfer_queue_tokens", direction="h2d") == 0


def test_a_device_only_cache_exports_no_host_series() -> None:
    registry = prometheus_client.CollectorRegistry()
    cache = RadixCache(None, None)
    exporter = PrometheusExporter(cache, registry, prefix="kv")
    cache.insert([1, 2, 3])
    cache.match_prefix([1, 2])
    got = _scrape(registry)
    assert got[("kv_cache_hit_tokens_total", (("tier", "device"),))] == 2
    assert not any("host" in dict(labels).values() for _, labels in got)
    assert not any(name.startswith("kv_transfer") for name, _ in got)
    exporter.close()
    assert not _scrape(registry)


@pytest.mark.parametrize(
    ("kwargs", "error", "word"),
    [
        ({"cache": object()}, TypeError, "cache"),
        ({"prefix": "hi-cache"}, ValueError, "prefix"),
        ({"labels": {"tier": "x"}}, ValueError, "labels"),
        ({"labels": {"model": 1}}, TypeError, "labels"),
        ({"labels": ["model"]}, TypeError, "labels must be a mapping"),
        ({"labels": [("model", "x")]}, TypeError, "labels must be a mapping"),
    ],
)
def test_bad_arguments_raise_before_registering(kwargs, error, word) -> None:
    registry = prometheus_client.CollectorRegistry()
    args = {"cache": RadixCache(None, None), "registry": registry, **kwargs}
    with pytest.raises(error, match=word):
        PrometheusExporter(**args)
    assert not _scrape(registry)


def test_storage_rows_follow_the_storage_tier() -> None:
    """8 tokens in pages of 2 backed up to an in-process store: the storage series say so."""
    registry = prometheus_client.CollectorRegistry()
    cache = make_cache(page_size=2, hicache_storage_backend="memory")
    put(cache, list(range(1, 9)))
    cache.drain_transfers()
    cache.check_hicache_events()
    PrometheusExporter(cache, registry)
    got = _scrape(registry)
    st = cache.stats().storage
    assert st is not None and st.backup_pages == 4 and st.bytes_written > 0

    def at(name: str, **labels: str) -> float:
        return got[(f"hicache_{name}", tuple(sorted({"backend": st.backend, **labels}.items())))]

    assert at("storage_backup_pages_total") == 4
    assert at("storage_bytes_total", direction="write") == st.bytes_written
    assert at("storage_bytes_total", direction="read") == 0
    assert at("storage_seconds_total", direction="write") == st.write_seconds
    assert at("storage_pending", kind="backup") == st.pending_backups == 0
    assert at("storage_queries_total") == at("storage_failures_total") == 0
    breaker = [name for name, _ in got if name.startswith("hicache_storage_breaker")]
    if st.breaker_state == "none":
        assert not breaker
    else:
        assert at("storage_breaker_state", state=st.breaker_state) == 0  # closed
    plain = _scrape_names(make_cache(page_size=2))
    assert not any(name.startswith("hicache_storage") for name in plain)


def _scrape_names(cache) -> set[str]:
    registry = prometheus_client.CollectorRegistry()
    PrometheusExporter(cache, registry)
    return {name for name, _ in _scrape(registry)}


def test_a_hybrid_cache_exports_its_states_and_tombstones_by_tier() -> None:
    from tests.radix.hybrid_host_rig import HybridHostRig

    rig = HybridHostRig("FSL", load_back_threshold=0)
    ids = [1, 2, 3, 4]
    rig.put(ids)
    rig.put([9, 9, 9, 9])
    rig.evict_all()
    m = rig.cache.match_prefix(RadixKey(ids))
    rig.cache.init_load_back(m.last_host_node, m.host_hit_length)
    rig.cache.match_prefix(RadixKey(ids))  # a device hit on the restored state
    registry = prometheus_client.CollectorRegistry()
    PrometheusExporter(rig.cache, registry)
    got = _scrape(registry)

    def at(name: str, **labels: str) -> float:
        return got[(f"hicache_{name}", tuple(sorted(labels.items())))]

    assert at("recurrent_states", tier="device") == 1
    assert at("recurrent_states", tier="host") == 2
    assert (
        at("recurrent_state_capacity", tier="host")
        == rig.cache.stats().host_components.host_state_capacity
    )
    assert at("recurrent_state_hits_total", tier="host") == 1
    assert at("recurrent_state_hits_total", tier="device") == 1
    assert at("recurrent_state_events_total", tier="host", event="backed_up") == 2
    assert at("recurrent_state_events_total", tier="device", event="evicted") == 2
    assert at("recurrent_state_events_total", tier="device", event="stored") == 3
    assert at("swa_tombstoned_tokens") == 0 and at("swa_tombstones_total") == 0
