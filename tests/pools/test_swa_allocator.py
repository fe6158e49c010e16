"""SWATokenToKVPoolAllocator: slots in both pools, the full->SWA map, free_swa, misuse."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import SWAKVPool, SWATokenToKVPoolAllocator
from tests.pools.helpers import DEVICES

SIZE, SIZE_SWA, PAGE = 16, 8, 2


def make(device: str = "cpu", page: int = PAGE) -> SWATokenToKVPoolAllocator:
    pool = SWAKVPool(SIZE, SIZE_SWA, page, torch.float16, 2, 4, [1], [0], device)
    return SWATokenToKVPoolAllocator(SIZE, SIZE_SWA, page, device, pool)


def state(alloc: SWATokenToKVPoolAllocator) -> tuple[int, int, list[int]]:
    mapping = alloc.full_to_swa_index_mapping.tolist()
    return alloc.full_available_size(), alloc.swa_available_size(), mapping


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page", [1, PAGE])
def test_alloc_maps_each_full_slot_to_its_own_swa_slot(device: str, page: int) -> None:
    alloc = make(device, page)
    assert (alloc.size, alloc.size_full, alloc.size_swa) == (SIZE_SWA, SIZE, SIZE_SWA)
    full = alloc.alloc(6)
    assert full is not None and full.device.type == device
    swa = alloc.full_to_swa_index_mapping[full]
    assert swa.unique().numel() == 6 and bool((swa >= page).all())
    assert bool((swa < SIZE_SWA + page).all())
    if page > 1:  # pages pair up: a full page's slots map to one SWA page, in order
        pairs = swa.view(-1, page)
        assert bool((pairs[:, 0] % page == 0).all()) and bool((pairs.diff(dim=1) == 1).all())
    unmapped = torch.ones(SIZE + page, dtype=torch.bool, device=device)
    unmapped[full] = False
    assert not alloc.full_to_swa_index_mapping[:-1][unmapped].any()
    assert int(alloc.full_to_swa_index_mapping[-1]) == -1
    assert (alloc.full_available_size(), alloc.swa_available_size()) == (SIZE - 6, SIZE_SWA - 6)
    assert alloc.available_size() == SIZE_SWA - 6
    alloc.check_invariants()


def test_alloc_short_in_the_swa_pool_returns_none_and_takes_nothing() -> None:
    alloc = make()
    assert alloc.alloc(6) is not None
    before = state(alloc)
    assert alloc.alloc(4) is None  # the full pool has 10 free, the SWA pool 2
    assert state(alloc) == before
    assert alloc.alloc(2) is not None
    alloc.check_invariants()


def test_free_swa_releases_window_slots_and_free_the_rest() -> None:
    alloc = make()
    full = alloc.alloc(8)
    assert full is not None
    assert alloc.alloc(2) is None  # the SWA pool is full
    old, recent = full[:4], full[4:]
    old_swa = alloc.full_to_swa_index_mapping[old].clone()
    alloc.free_swa(old)
    assert not alloc.full_to_swa_index_mapping[old].any()
    assert alloc.full_available_size() == SIZE - 8 and alloc.swa_available_size() == 4
    alloc.check_invariants()
    again = alloc.alloc(4)  # the SWA slots freed are handed out again
    assert again is not None
    assert set(alloc.full_to_swa_index_mapping[again].tolist()) == set(old_swa.tolist())
    alloc.free(full)  # frees the SWA slots of `recent` only: `old` has none any more
    assert alloc.full_available_size() == SIZE - 4 and alloc.swa_available_size() == 4
    assert not alloc.full_to_swa_index_mapping[recent].any()
    alloc.check_invariants()


def test_free_group_defers_both_pools() -> None:
    alloc = make()
    full = alloc.alloc(4)
    assert full is not None
    alloc.free_group_begin()
    alloc.free(full)
    assert (alloc.full_available_size(), alloc.swa_available_size()) == (SIZE - 4, SIZE_SWA - 4)
    alloc.free_group_end()
    assert (alloc.full_available_size(), alloc.swa_available_size()) == (SIZE, SIZE_SWA)
    alloc.check_invariants()


def test_clear() -> None:
    alloc = make()
    assert alloc.alloc(6) is not None
    alloc.clear()
    assert state(alloc) == (SIZE, SIZE_SWA, [0] * (SIZE + PAGE) + [-1])


def test_check_invariants_catches_a_corrupt_mapping() -> None:
    alloc = make()
    full = alloc.alloc(2)
    assert full is not None
    alloc.full_to_swa_index_mapping[full[0]] = alloc.full_to_swa_index_mapping[full[1]]
    with pytest.raises(RuntimeError, match="SWA slot"):
        alloc.check_invariants()


@pytest.mark.parametrize(
    ("call", "bad", "error"),
    [
        ("free", torch.tensor([2.0]), TypeError),
        ("free", torch.tensor([0]), ValueError),  # slot 0's page is reserved
        ("free", torch.tensor([SIZE + PAGE]), ValueError),
        ("free", "twice", ValueError),
        ("free_swa", torch.tensor([2.0]), TypeError),
        ("free_swa", torch.tensor([[2]]), ValueError),
        ("free_swa", torch.tensor([SIZE + PAGE]), ValueError),
        ("free_swa", [2], TypeError),
    ],
)
def test_free_misuse_changes_nothing(call: str, bad: object, error: type) -> None:
    alloc = make()
    full = alloc.alloc(4)
    assert full is not None
    if bad == "twice":
        alloc.free(full[:2])
        bad = full[:2]
    before = state(alloc)
    with pytest.raises(error, match="indices|free_index"):
        getattr(alloc, call)(bad)
    assert state(alloc) == before
    alloc.check_invariants()


def test_constructor_misuse() -> None:
    pool = SWAKVPool(SIZE, SIZE_SWA, PAGE, torch.float16, 2, 4, [1], [0], "cpu")
    with pytest.raises(ValueError, match="size_swa"):
        SWATokenToKVPoolAllocator(SIZE, SIZE_SWA * 2, PAGE, "cpu", pool)
    with pytest.raises(TypeError, match="kvcache"):
        SWATokenToKVPoolAllocator(SIZE, SIZE_SWA, PAGE, "cpu", pool.full_kv_pool)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="need_size"):
        SWATokenToKVPoolAllocator(SIZE, SIZE_SWA, PAGE, "cpu", pool).alloc(2.0)  # type: ignore[arg-type]
    assert pool.full_to_swa_index_mapping is not None
