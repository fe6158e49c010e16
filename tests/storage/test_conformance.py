"""Every backend, every host pool kind and layout: the ``HiCacheStorage`` contract."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.storage.conftest import fill_random, keys_for, page_bytes, poison, slots

SRC = [0, 1, 2, 3]  # host pages the tests write from
DST = [8, 9, 10, 11]  # and read into


def _page_bytes(host: Any, pages: list[int]) -> list[list[bytes]]:
    return [page_bytes(host, p * host.page_size) for p in pages]


def _poisoned(host: Any, pages: list[int]) -> bool:
    return all(set(b"".join(parts)) == {0xA5} for parts in _page_bytes(host, pages))


def test_round_trip_is_byte_exact(host: Any, backend_factory: Any) -> None:
    store = backend_factory(host)
    keys = keys_for(host, 4)
    expected = _page_bytes(host, SRC)
    assert store.batch_set_v1(keys, slots(SRC)) == [True] * 4
    poison(host)
    assert store.batch_exists(keys) == 4
    assert store.batch_get_v1(keys, slots(DST)) == [True] * 4
    assert _page_bytes(host, DST) == expected
    assert _poisoned(host, SRC + [12, 13])  # nothing else written


def test_exists_counts_the_present_prefix(host: Any, backend_factory: Any) -> None:
    store = backend_factory(host)
    keys = keys_for(host, 4)
    present = [0, 1, 3]
    assert store.batch_set_v1([keys[i] for i in present], slots(present)) == [True] * 3
    assert store.batch_exists(keys) == 2  # the missing page 2 ends the prefix
    assert store.batch_exists(keys[3:]) == 1
    assert store.batch_exists(keys[2:]) == 0
    assert store.batch_exists([]) == 0


def test_set_is_write_once(host: Any, backend_factory: Any) -> None:
    store = backend_factory(host)
    keys = keys_for(host, 2)
    first = _page_bytes(host, SRC[:2])
    assert store.batch_set_v1(keys, slots(SRC[:2])) == [True, True]
    fill_random(host, seed=2)  # other bytes under the same keys
    assert store.batch_set_v1(keys, slots(SRC[:2])) == [True, True]
    poison(host)
    assert store.batch_get_v1(keys, slots(DST[:2])) == [True, True]
    assert _page_bytes(host, DST[:2]) == first


def test_get_of_missing_pages_leaves_their_slots(host: Any, backend_factory: Any) -> None:
    store = backend_factory(host)
    keys = keys_for(host, 3)
    expected = _page_bytes(host, [0, 2])
    assert store.batch_set_v1([keys[0], keys[2]], slots([0, 2])) == [True, True]
    poison(host)
    assert store.batch_get_v1(keys, slots(DST[:3])) == [True, False, True]
    assert _page_bytes(host, [DST[0], DST[2]]) == expected
    assert _poisoned(host, [DST[1]])


@pytest.mark.parametrize(
    "change", [{"model_revision": "r2"}, {"model_id": "other"}, {"kv_dtype": "fp8"}]
)
def test_another_fingerprint_misses(host: Any, backend_factory: Any, change: dict) -> None:
    store = backend_factory(host)
    keys, other = keys_for(host, 2), keys_for(host, 2, **change)
    assert set(keys).isdisjoint(other)
    assert store.batch_set_v1(keys, slots(SRC[:2])) == [True, True]
    poison(host)
    assert store.batch_exists(other) == 0
    assert store.batch_get_v1(other, slots(DST[:2])) == [False, False]
    assert _poisoned(host, DST[:2])


def test_namespaces_do_not_share_pages(host: Any, backend_factory: Any) -> None:
    store = backend_factory(host)
    tenant_a, tenant_b = keys_for(host, 3, "tenant-a"), keys_for(host, 3, "tenant-b")
    default = keys_for(host, 3, None)
    assert store.batch_set_v1(tenant_a, slots(SRC[:3])) == [True] * 3
    assert store.batch_exists(keys_for(host, 3, "tenant-a")) == 3  # same salt: a hit
    assert store.batch_exists(tenant_b) == 0
    assert store.batch_exists(default) == 0
    poison(host)
    assert store.batch_get_v1(tenant_b, slots(DST[:3])) == [False] * 3
    assert _poisoned(host, DST[:3])


def _misuse(host: Any) -> list[tuple[type[Exception], Any, Any]]:
    ps = host.page_size
    keys = keys_for(host, 2)
    return [
        (ValueError, keys, slots([0])),  # one page of slots for two keys
        (ValueError, keys, slots([0, 1]) + 1),  # pages not aligned
        (ValueError, keys, torch.cat([slots([0]), slots([1]).flip(0)])),  # not consecutive
        (IndexError, keys, slots([0, host.size // ps])),  # past the pool
        (IndexError, keys, slots([0, 1]) - 2 * ps),  # negative
        (TypeError, keys, slots([0, 1]).int()),
        (TypeError, keys, slots([0, 1]).tolist()),
        (ValueError, keys, slots([0, 1]).view(2, ps)),
        (TypeError, tuple(keys), slots([0, 1])),
        (TypeError, [keys[0], 7], slots([0, 1])),
        (ValueError, [keys[0], "../escape"], slots([0, 1])),
        (ValueError, [keys[0], ""], slots([0, 1])),
        (ValueError, [keys[0], "x" * 161], slots([0, 1])),
    ]


def test_misuse_raises_before_any_change(host: Any, backend_factory: Any) -> None:
    store = backend_factory(host)
    stored = keys_for(host, 1, seed=9)
    assert store.batch_set_v1(stored, slots([5])) == [True]
    poison(host)
    for error, keys, indices in _misuse(host):
        with pytest.raises(error):
            store.batch_set_v1(keys, indices)
        with pytest.raises(error):
            store.batch_get_v1(stored + keys[1:], indices)
        assert _poisoned(host, SRC + DST)
    assert store.batch_exists(keys_for(host, 2)) == 0  # nothing written
    assert store.get_stats()["objects"] == host.parts
    for bad in (("k",), ["../x"], [1]):
        with pytest.raises((TypeError, ValueError)):
            store.batch_exists(bad)


def test_pool_registration_is_required_once(host: Any, backend_factory: Any) -> None:
    store = backend_factory()
    with pytest.raises(ValueError, match="register_mem_pool_host"):
        store.batch_exists(keys_for(host, 1))
    with pytest.raises(TypeError, match="mem_pool_host must be a HostKVPool, .*got object"):
        store.register_mem_pool_host(object())
    store.register_mem_pool_host(host)
    with pytest.raises(ValueError, match="already registered"):
        store.register_mem_pool_host(host)


def test_calls_after_close_are_misses(host: Any, backend_factory: Any) -> None:
    store = backend_factory(host)
    keys = keys_for(host, 2)
    assert store.batch_set_v1(keys[:1], slots([0])) == [True]
    poison(host)
    store.close()
    store.close()  # idempotent
    assert store.batch_exists(keys) == 0
    assert store.batch_get_v1(keys, slots(DST[:2])) == [False, False]
    assert store.batch_set_v1(keys, slots(SRC[:2])) == [False, False]
    assert _poisoned(host, SRC + DST)
    with pytest.raises(ValueError):
        store.batch_get_v1(keys, slots([0]))  # misuse still raises


def test_stats_count_objects_and_clear_removes_them(host: Any, backend_factory: Any) -> None:
    store = backend_factory(host)
    keys = keys_for(host, 3)
    assert store.batch_set_v1(keys, slots(SRC[:3])) == [True] * 3
    stats = store.get_stats()
    assert stats["objects"] == 3 * host.parts
    assert stats["bytes_used"] == 3 * host.parts * store.page_io().stored_bytes
    store.clear()
    assert store.batch_exists(keys) == 0
    assert store.get_stats()["objects"] == 0
    assert store.batch_set_v1(keys, slots(SRC[:3])) == [True] * 3  # usable after clear
    assert store.batch_exists(keys) == 3
