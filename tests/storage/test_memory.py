"""MemoryStorage beyond the shared contract: its optional byte cap, an LRU of whole pages."""

from __future__ import annotations

from typing import Any

import pytest

from hicache.backends.memory import MemoryStorage
from tests.storage.conftest import PAGE, fill_random, keys_for, make_host, page_bytes, poison, slots


def _store(host: Any, **kw: Any) -> MemoryStorage:
    store = MemoryStorage(**kw)
    store.register_mem_pool_host(host)
    return store


def _page(host: Any) -> int:
    """Bytes one page takes in the store (every part with its trailer)."""
    return host.parts * _store(host).page_io().stored_bytes


@pytest.mark.parametrize(("value", "error"), [(0, ValueError), ("1", TypeError), (True, TypeError)])
def test_bad_caps_raise(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_bytes"):
        MemoryStorage(max_bytes=value)


def test_without_a_cap_nothing_is_evicted() -> None:
    host = make_host("mha", "page_first")
    store = _store(host)
    keys = keys_for(host, 8)
    assert store.batch_set_v1(keys, slots(list(range(8)))) == [True] * 8
    stats = store.get_stats()
    assert store.batch_exists(keys) == 8 and "max_bytes" not in stats
    assert stats["bytes_used"] == 8 * _page(host)


def test_the_cap_evicts_the_least_recently_used_page() -> None:
    host = make_host("mha", "layer_first")
    fill_random(host, seed=3)
    store = _store(host, max_bytes=3 * _page(host))
    evicted: list[str] = []
    store.on_evict = evicted.extend
    a, b, c, d = ([k] for k in keys_for(host, 4))
    assert store.batch_set_v1(a + b + c, slots([0, 1, 2])) == [True] * 3
    want = page_bytes(host, 0)
    poison(host)
    assert store.batch_get_v1(a, slots([5])) == [True]  # a read: a is now the newest
    assert page_bytes(host, 5 * PAGE) == want
    assert store.batch_set_v1(d, slots([3])) == [True]
    assert [store.batch_exists(k) for k in (a, b, c, d)] == [1, 0, 1, 1]
    assert evicted == b
    assert store.get_stats() == {
        "backend": "memory",
        "objects": 6,
        "bytes_used": 3 * _page(host),
        "max_bytes": 3 * _page(host),
    }


def test_a_page_larger_than_the_cap_fails_and_the_rest_of_the_batch_too() -> None:
    host = make_host("mla", "page_first")
    store = _store(host, max_bytes=_page(host) - 1)
    keys = keys_for(host, 2)
    assert store.batch_set_v1(keys, slots([0, 1])) == [False, False]
    assert store.batch_exists(keys) == 0 and store.get_stats()["bytes_used"] == 0
