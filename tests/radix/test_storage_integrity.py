"""Integrity end to end: a storage object carries its page's checksum; a read that does not
verify is a counted miss, removed and recomputed; ``verify`` trusts a clean storage hit."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hicache.radix.page_hash import namespace_seed, page_hashes
from tests.radix.storage_helpers import (
    CASES,
    PAGE,
    kv_of,
    load,
    make_stack,
    prefetch,
    storage_config,
    write_prefix,
)

TOKENS = 32  # eight pages


def _ids(seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 30_000) for _ in range(TOKENS)]


def _page_key(stack: Any, ids: list[int], page: int) -> str:
    """The storage key of page ``page`` of ``ids`` (no namespace)."""
    hashes = page_hashes(np.asarray(ids, np.int32), PAGE, namespace_seed(None))
    return str(stack.cache.storage_tier.keys.page_keys(hashes)[page])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[3] ^= 0x10
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _zero_tail(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] + bytes(len(data) - len(data) // 2))


def _read_back(cfg: Any, ids: list[int], **kw: Any) -> tuple[Any, int, torch.Tensor]:
    reader = make_stack(cfg, **kw)
    loaded = prefetch(reader.cache, "r", ids)
    host_hit, slots = load(reader, ids)
    assert host_hit == loaded
    return reader, loaded, slots


@pytest.mark.parametrize("damage", [_flip, _zero_tail])
@pytest.mark.parametrize(("mla", "layout", "io_backend"), CASES)
def test_a_corrupt_file_object_is_a_counted_miss_removed_never_served(
    tmp_path: Path, mla: bool, layout: str, io_backend: str, damage: Any
) -> None:
    cfg = storage_config(tmp_path)
    kw = {"mla": mla, "layout": layout, "io_backend": io_backend}
    ids = _ids()
    expected = write_prefix(make_stack(cfg, **kw), ids, seed=5)
    # Intact, a reader finds every page; then one object of the fourth page is damaged.
    reader, loaded, _ = _read_back(cfg, ids, **kw)
    assert loaded == TOKENS and reader.cache.stats().storage.faults.get("checksum_mismatch", 0) == 0
    victim = _object_of_page(tmp_path, reader, ids, 3)
    size = victim.stat().st_size
    damage(victim)
    assert victim.stat().st_size == size  # same size: the old check let it through
    reader, loaded, slots = _read_back(cfg, ids, **kw)
    assert loaded == 3 * PAGE  # the verified head only; the rest is recomputed
    assert reader.cache.stats().storage.faults["checksum_mismatch"] == 1
    assert not victim.exists()
    for want, got in zip(expected, kv_of(reader, slots), strict=True):
        assert torch.equal(want[: 3 * PAGE], got)


def _object_of_page(root: Path, stack: Any, ids: list[int], page: int) -> Path:
    """The first object file of page ``page`` of ``ids`` under ``root``."""
    found = sorted(root.glob(f"*/{_page_key(stack, ids, page)}_*.bin"))
    assert found
    return found[0]


@pytest.mark.parametrize(("mla", "layout", "io_backend"), CASES)
def test_verify_all_trusts_clean_storage_hits(
    tmp_path: Path, mla: bool, layout: str, io_backend: str
) -> None:
    cfg = storage_config(tmp_path)
    kw = {"mla": mla, "layout": layout, "io_backend": io_backend, "verify": "all"}
    ids = _ids()
    expected = write_prefix(make_stack(cfg, **kw), ids, seed=7)
    reader, loaded, slots = _read_back(cfg, ids, **kw)
    assert loaded == TOKENS and len(slots) == TOKENS
    stats = reader.cache.stats()
    assert stats.transfer is not None and stats.transfer.integrity_failures == 0
    assert stats.storage is not None and "checksum_mismatch" not in stats.storage.faults
    for want, got in zip(expected, kv_of(reader, slots), strict=True):
        assert torch.equal(want, got)


def test_verify_all_still_catches_a_host_page_corrupted_after_a_storage_read(
    tmp_path: Path,
) -> None:
    cfg = storage_config(tmp_path)
    ids = _ids()
    write_prefix(make_stack(cfg, verify="all"), ids, seed=7)
    reader = make_stack(cfg, verify="all")
    assert prefetch(reader.cache, "r", ids) == TOKENS
    for part in reader.cache.cache_controller.mem_pool_host.host_parts:  # every host byte
        part.view(torch.uint8).add_(1)
    host_hit, slots = load(reader, ids)
    assert len(slots) == 0
    stats = reader.cache.stats()
    assert stats.transfer is not None and stats.transfer.integrity_failures >= 1


def test_pages_written_without_checksums_load_unchecked_under_verify_all(tmp_path: Path) -> None:
    """A writer with ``verify="off"`` keeps no page checksum: its objects carry ``NO_SUM``; a
    reader with ``verify="all"`` loads them (the digest checked them) and reports no failure."""
    cfg = storage_config(tmp_path)
    ids = _ids(3)
    expected = write_prefix(make_stack(cfg, verify="off"), ids, seed=9)
    reader, loaded, slots = _read_back(cfg, ids, verify="all")
    assert loaded == TOKENS
    stats = reader.cache.stats()
    assert stats.transfer is not None and stats.transfer.integrity_failures == 0
    for want, got in zip(expected, kv_of(reader, slots), strict=True):
        assert torch.equal(want, got)
