"""Page objects carry a checksum trailer: a damaged or old-format object is a counted miss."""

from __future__ import annotations

from pathlib import Path

from hicache.backends.file import HiCacheFile
from hicache.backends.memory import MemoryStorage
from tests.storage.conftest import fill_random, keys_for, make_host, poison, slots


def test_a_damaged_memory_object_is_a_counted_miss_and_removed() -> None:
    host = make_host("mha", "page_head")
    fill_random(host, 1)
    store = MemoryStorage()
    store.register_mem_pool_host(host)
    keys = keys_for(host, 3)
    assert store.batch_set_v1(keys, slots([0, 1, 2])) == [True] * 3
    raw = bytearray(store._objects[f"{keys[1]}_v"])  # noqa: SLF001 (damage one object)
    raw[7] ^= 0x40
    store._objects[f"{keys[1]}_v"] = bytes(raw)  # noqa: SLF001
    poison(host)
    assert store.batch_get_v1(keys, slots([4, 5, 6])) == [True, False, True]
    assert store.fault_counts() == {"checksum_mismatch": 1}
    assert store.batch_exists(keys) == 1


def test_an_object_without_a_trailer_is_a_miss(tmp_path: Path) -> None:
    host = make_host("mla", "page_first")
    fill_random(host, 2)
    store = HiCacheFile(root=tmp_path)
    store.register_mem_pool_host(host)
    keys = keys_for(host, 1)
    assert store.batch_set_v1(keys, slots([0])) == [True]
    (path,) = tmp_path.glob("*/*.bin")
    path.write_bytes(path.read_bytes()[: -store.page_io().trailer_bytes])  # the old format
    assert store.batch_get_v1(keys, slots([1])) == [False]
    assert store.batch_exists(keys) == 0 and not path.exists()
