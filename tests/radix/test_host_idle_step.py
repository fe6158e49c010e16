"""``check_hicache_events`` on an idle host tier skips the settle, and only then: a queued
write, an ack to pop or a load in flight still gets its step."""

from __future__ import annotations

from typing import Any

import pytest

from hicache.radix import HiRadixCache, RadixKey
from tests.radix.hiradix_rig import assert_kv, device_pool, make_cache, put, tokens_of


def count_calls(cache: HiRadixCache, name: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each call of ``cache``'s controller method ``name`` appends to the returned list."""
    ctrl, calls = cache.cache_controller, []
    real = getattr(ctrl, name)

    def counted() -> Any:
        calls.append(1)
        return real()

    monkeypatch.setattr(ctrl, name, counted)
    return calls


def test_an_idle_step_skips_the_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = make_cache(pages=8)
    put(cache, tokens_of(4, seed=1))  # backed up and landed: nothing left in flight
    assert cache.host_tier.idle()
    calls = count_calls(cache, "start_writing", monkeypatch)
    cache.check_hicache_events()
    assert calls == []
    cache.check_invariants()


def test_a_queued_write_is_issued_by_the_next_step(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = make_cache(pages=8)
    ctrl = cache.cache_controller
    real = ctrl.start_writing
    monkeypatch.setattr(ctrl, "start_writing", lambda: None)  # the insert's issue does nothing
    put(cache, tokens_of(4, seed=2))
    assert ctrl.write_queue and not cache.host_tier.idle()
    monkeypatch.setattr(ctrl, "start_writing", real)
    calls = count_calls(cache, "start_writing", monkeypatch)
    cache.check_hicache_events()
    assert calls == [1] and not ctrl.write_queue and cache.host_tier.idle()
    assert cache.host_tier.pending() == {"write": [], "load": []}
    cache.check_invariants()


def test_a_deferred_load_is_finished_and_released_by_the_next_step() -> None:
    cache = make_cache(pages=8, layers_ahead=1)
    tokens = tokens_of(4, seed=3)
    put(cache, tokens)
    cache.evict(cache.total_size())
    match = cache.match_prefix(RadixKey(tokens))
    loaded, node = cache.init_load_back(match.last_host_node, match.host_hit_length)
    assert cache.ready_to_load_host_cache() >= 0
    ack = cache.cache_controller.ack_load_queue[-1]
    assert not ack.finish_event.query() and not cache.host_tier.idle()  # layer 1 not issued
    cache.check_hicache_events()
    assert cache.host_tier.idle() and cache.host_tier.pending()["load"] == []
    assert node.lock_ref == 0  # the transfer lock is gone; the caller never took one
    assert_kv(device_pool(cache), loaded, tokens)
    cache.check_invariants()


def test_nothing_to_load_on_an_idle_tier_is_minus_one_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = make_cache(pages=8)
    put(cache, tokens_of(4, seed=4))
    calls = count_calls(cache, "start_loading", monkeypatch)
    assert cache.ready_to_load_host_cache() == -1 and calls == []


def test_a_queued_load_or_a_busy_tier_gets_the_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = make_cache(pages=8)
    tokens = tokens_of(4, seed=5)
    put(cache, tokens)
    cache.evict(cache.total_size())
    match = cache.match_prefix(RadixKey(tokens))
    cache.init_load_back(match.last_host_node, match.host_hit_length)
    calls = count_calls(cache, "start_loading", monkeypatch)
    assert cache.ready_to_load_host_cache() >= 0 and calls == [1]
    ctrl = cache.cache_controller
    monkeypatch.setattr(ctrl, "start_writing", lambda: None)  # a write stays queued
    put(cache, tokens_of(4, seed=6))
    assert not cache.host_tier.idle()
    assert cache.ready_to_load_host_cache() == -1 and calls == [1, 1]
    cache.check_invariants()
