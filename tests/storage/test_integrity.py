"""Page objects carry a checksum trailer: a damaged or old-format object is a counted miss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hicache.backends.file import HiCacheFile, bucket_of
from hicache.backends.memory import MemoryStorage
from hicache.backends.page_sum import check_trailer, make_trailer, sums_of, trailer_bytes
from hicache.kernels.checksum import NO_SUM
from tests.storage.conftest import PAGE, fill_random, keys_for, make_host, poison, slots


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


def _sums(host: Any) -> torch.Tensor:
    """A host tier's checksum store for ``host``, filled with distinct positive values."""
    pages = host.size // PAGE
    return torch.arange(pages * host.layer_num, dtype=torch.int64).view(pages, -1) * 7919 + 3


def test_the_page_checksum_travels_with_the_page(host: Any, backend_factory: Any) -> None:
    """Written from host page 0, read into host page 5: page 5's row is page 0's checksum;
    a read that misses leaves its rows marked as unchecked (NO_SUM), never stale."""
    store = backend_factory(host)
    sums = _sums(host)
    store.page_io().attach_checksums(sums)
    keys = keys_for(host, 2)
    assert store.batch_set_v1(keys, slots([0, 1])) == [True, True]
    want = sums[:2].clone()
    store.page_io().forget(slots([5, 6, 7]))
    assert (sums[5:8] == NO_SUM).all()
    assert store.batch_get_v1(keys + keys_for(host, 1, seed=9), slots([5, 6, 7])) == [
        True,
        True,
        False,
    ]
    assert torch.equal(sums[5:7], want) and (sums[7] == NO_SUM).all()


def test_a_page_written_without_checksums_reads_as_unchecked(
    host: Any, backend_factory: Any
) -> None:
    writer = backend_factory(host)
    keys = keys_for(host, 1)
    assert writer.batch_set_v1(keys, slots([0])) == [True]
    sums = _sums(host)
    writer.page_io().attach_checksums(sums)
    assert writer.batch_get_v1(keys, slots([3])) == [True]
    assert (sums[3] == NO_SUM).all()


@pytest.mark.parametrize(
    "damage",
    [
        lambda t: t[:-1] + bytes([t[-1] ^ 1]),  # the digest
        lambda t: t[:9] + bytes([t[9] ^ 0x80]) + t[10:],  # the carried checksum
        lambda t: b"hcsum\x01\x00\x00" + t[8:],  # another format
    ],
    ids=["digest", "checksum", "magic"],
)
def test_a_damaged_trailer_never_verifies(damage: Any) -> None:
    payload = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)
    sums = np.array([11, 22, 33], np.int64)
    trailer = make_trailer("k_0", payload, sums)
    assert len(trailer) == trailer_bytes(3)
    got = check_trailer("k_0", payload, trailer)
    assert got is not None and np.array_equal(sums_of(got), sums)
    assert check_trailer("k_0", payload, damage(trailer)) is None
    assert check_trailer("k_1", payload, trailer) is None  # another key's object
    flipped = payload.copy()
    flipped[4095] ^= 0x01
    assert check_trailer("k_0", flipped, trailer) is None


def test_an_object_renamed_under_another_key_is_a_miss(tmp_path: Path) -> None:
    host = make_host("mha", "page_first")
    fill_random(host, 3)
    store = HiCacheFile(root=tmp_path)
    store.register_mem_pool_host(host)
    a, b = keys_for(host, 2)
    assert store.batch_set_v1([a], slots([0])) == [True]
    for path in tmp_path.glob(f"*/{a}_*.bin"):  # page b's objects made from page a's
        target = tmp_path / bucket_of(b) / path.name.replace(a, b)
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(path.read_bytes())
    assert store.batch_exists([b]) == 1
    assert store.batch_get_v1([b], slots([3])) == [False]
    assert store.batch_exists([b]) == 0 and store.fault_counts() == {"checksum_mismatch": 1}
