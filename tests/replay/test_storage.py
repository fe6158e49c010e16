"""Replays through the storage tier: built, hit once the host is too small, capped, timed,
removed at the end; the tiering settings reach the cache."""

import os

import pytest

from hicache.replay import runner as runner_module
from hicache.replay.config import ReplayConfig
from hicache.replay.runner import replay
from tests.replay.chat import FAST, chat_trace

# 4096 device tokens, a host only 1.5x that: the host evicts what later turns need.
SMALL = dict(device_tokens=4096, host_ratio=1.5, max_running=2, load_back_threshold=0, **FAST)


def _hits(run):
    rs = run.records
    return (
        sum(r.device_hit for r in rs),
        sum(r.host_hit for r in rs),
        sum(r.storage_hit for r in rs),
    )


@pytest.mark.parametrize("backend", ["memory", "file"])
def test_storage_serves_what_the_small_host_evicted(backend):
    trace = chat_trace()
    without = replay(trace, ReplayConfig(**SMALL))
    run = replay(trace, ReplayConfig(**SMALL, storage=backend))
    device, host, storage = _hits(run)
    assert run.stats.host is not None and run.stats.host.evicted_tokens > 0
    assert storage > 0 and device + host + storage == run.ideal_total
    assert sum(_hits(without)) < run.ideal_total  # the host alone could not serve it
    assert run.stats.storage is not None
    assert run.stats.storage.bytes_read == storage * run.config.token_bytes
    assert all(
        r.computed == r.prompt_tokens - r.device_hit - r.host_hit - r.storage_hit
        for r in run.records
    )


def test_same_trace_same_storage_hits():
    cfg = ReplayConfig(**SMALL, storage="memory", storage_capacity=8192)
    first, second = replay(chat_trace(), cfg), replay(chat_trace(), cfg)
    assert first.records == second.records and first.modelled_s == second.modelled_s


def test_capacity_caps_the_store_and_its_hits():
    trace = chat_trace()
    uncapped = replay(trace, ReplayConfig(**SMALL, storage="memory"))
    cfg = ReplayConfig(**SMALL, storage="memory", storage_capacity=4096)
    capped = replay(trace, cfg)
    stats = capped.stats.storage
    assert stats is not None and stats.capacity_bytes == 4096 // 16 * cfg.storage_page_bytes
    assert stats.used_bytes is not None and 0 < stats.used_bytes <= stats.capacity_bytes
    assert _hits(capped)[2] < _hits(uncapped)[2]


def test_the_file_store_lives_in_a_temporary_directory_removed_at_the_end(monkeypatch):
    made = []
    real = runner_module.tempfile.TemporaryDirectory

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(runner_module.tempfile, "TemporaryDirectory", recording)
    run = replay(chat_trace(), ReplayConfig(**SMALL, storage="file", storage_capacity=1 << 20))
    assert _hits(run)[2] > 0 and len(made) == 1 and not os.path.exists(made[0].name)


def test_storage_reads_take_modelled_time_at_the_storage_bandwidth():
    trace = chat_trace()
    fast = replay(trace, ReplayConfig(**SMALL, storage="memory", storage_gbps=1e3))
    slow = replay(trace, ReplayConfig(**SMALL, storage="memory", storage_gbps=1e-4))
    assert _hits(fast) == _hits(slow) and _hits(fast)[2] > 0
    assert slow.modelled_s > fast.modelled_s
    assert slow.cost.storage_bytes_per_s == pytest.approx(1e5)


@pytest.mark.parametrize("tiering", ["inclusive", "exclusive"])
def test_tiering_settings_reach_the_cache_and_the_replay_stays_exact(tiering):
    cfg = ReplayConfig(**SMALL, storage="memory", tiering=tiering, storage_tiering=tiering)
    hicache = cfg.hicache()
    assert hicache is not None and hicache.storage is not None
    assert hicache.tiering == tiering and hicache.storage.tiering == tiering
    assert hicache.storage.prefetch_policy == "wait_complete"
    run = replay(chat_trace(), cfg)
    assert sum(_hits(run)) <= run.ideal_total and not any(r.error for r in run.records)


def test_a_host_smaller_than_the_device_is_a_valid_setting():
    cfg = ReplayConfig(device_tokens=4096, host_ratio=0.5)
    assert cfg.hicache() is not None and cfg.host_tokens == 2048


@pytest.mark.parametrize(
    ("kw", "error", "words"),
    [
        ({"storage": "disk"}, ValueError, "storage must be one of"),
        ({"storage": "memory", "host_ratio": 0}, ValueError, "needs a host tier"),
        ({"storage_capacity": 4096}, ValueError, "storage_capacity needs a storage tier"),
        ({"storage": "memory", "storage_capacity": 8}, ValueError, "storage_capacity must be"),
        ({"storage": "memory", "storage_capacity": 1.5}, TypeError, "storage_capacity"),
        ({"tiering": "both"}, ValueError, "tiering must be one of"),
        ({"storage_tiering": "exclusive"}, ValueError, "storage_tiering needs a storage tier"),
        ({"storage": "memory", "storage_tiering": "x"}, ValueError, "storage_tiering must be"),
        ({"storage_gbps": 0.0}, ValueError, "storage_gbps must be > 0"),
    ],
)
def test_bad_storage_settings_raise_naming_the_setting(kw, error, words):
    with pytest.raises(error, match=words):
        ReplayConfig(**kw)


def test_the_file_store_needs_a_directory():
    with pytest.raises(ValueError, match="storage_root"):
        ReplayConfig(storage="file").build_stack(1024)
