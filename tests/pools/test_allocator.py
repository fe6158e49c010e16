"""Token and paged allocators: accounting, reserved page, free groups, bad input (CPU)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.pools import ReqToTokenPool, TokenToKVPoolAllocator


def snapshot(a: TokenToKVPoolAllocator) -> tuple[int, list[int]]:
    return a.available_size(), a.free_slots().tolist()


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_alloc_until_exhausted_never_hands_out_reserved_page(page_size: int) -> None:
    a = TokenToKVPoolAllocator(8 * page_size, page_size)
    got = [a.alloc(page_size) for _ in range(8)]
    assert a.alloc(page_size) is None
    assert a.available_size() == 0
    slots = torch.cat(got)
    assert slots.dtype == torch.int64
    assert sorted(slots.tolist()) == list(range(page_size, 9 * page_size))
    a.check_invariants()


@pytest.mark.parametrize("page_size", [1, 4])
def test_alloc_returns_whole_aligned_pages(page_size: int) -> None:
    a = TokenToKVPoolAllocator(16 * page_size, page_size)
    slots = a.alloc(3 * page_size)
    pages = slots.view(3, page_size)
    assert (pages[:, 0] % page_size == 0).all()
    assert (pages - pages[:, :1] == torch.arange(page_size)).all()


def test_free_returns_slots_and_accounting() -> None:
    a = TokenToKVPoolAllocator(64, 16)
    x, y = a.alloc(32), a.alloc(16)
    assert a.available_size() == 16
    assert a.free(x) == 32
    assert a.available_size() == 48
    assert a.free(y[:3]) == 16  # a partial page frees the whole page
    assert a.available_size() == 64
    a.check_invariants()


def test_alloc_zero_and_exhaustion_return_none_without_change() -> None:
    a = TokenToKVPoolAllocator(32, 16)
    assert a.alloc(0).numel() == 0
    before = snapshot(a)
    assert a.alloc(48) is None
    assert snapshot(a) == before


def test_freed_pages_come_back_sorted() -> None:
    a = TokenToKVPoolAllocator(4, 1)
    s = a.alloc(4)
    a.free(s[[3, 0]])
    a.free(s[[2]])
    assert a.alloc(3).tolist() == sorted(s[[0, 2, 3]].tolist())


def test_clear_restores_everything() -> None:
    a = TokenToKVPoolAllocator(32, 8)
    a.alloc(24)
    a.free_group_begin()
    a.clear()
    assert a.available_size() == 32
    assert a.free_slots().tolist() == list(range(8, 40))
    a.free_group_begin()  # clear closed the group
    a.free_group_end()
    a.check_invariants()


def test_free_group_defers_until_end() -> None:
    a = TokenToKVPoolAllocator(32, 8)
    x, y = a.alloc(8), a.alloc(8)
    a.free_group_begin()
    a.free(x)
    a.free(y)
    assert a.available_size() == 16
    with pytest.raises(ValueError, match="not allocated"):
        a.free(x)
    a.check_invariants()
    a.free_group_end()
    assert a.available_size() == 32
    a.check_invariants()


def test_free_group_misuse_raises() -> None:
    a = TokenToKVPoolAllocator(8, 1)
    with pytest.raises(RuntimeError, match="no free group"):
        a.free_group_end()
    a.free_group_begin()
    with pytest.raises(RuntimeError, match="already open"):
        a.free_group_begin()


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (lambda s: torch.tensor([0]), ValueError, "reserved"),
        (lambda s: torch.tensor([200]), ValueError, r"\[8, 40\)"),
        (lambda s: s[:1].float(), TypeError, "integer"),
        (lambda s: s[:2].tolist(), TypeError, "torch.Tensor"),
        (lambda s: s[:4].view(2, 2), ValueError, "1-D"),
        (lambda s: torch.cat([s[:1], s[:1]]), ValueError, "more than once"),
        (lambda s: torch.tensor([30]), ValueError, "not allocated"),
    ],
)
def test_bad_free_raises_before_any_change(bad: Callable, error: type, match: str) -> None:
    a = TokenToKVPoolAllocator(32, 8)
    slots = a.alloc(16)
    before = snapshot(a)
    with pytest.raises(error, match=match):
        a.free(bad(slots))
    assert snapshot(a) == before
    a.check_invariants()


@pytest.mark.parametrize(
    ("pick", "freed"),
    [
        (lambda s: s, 24),  # whole pages in order: the per-page fast path
        (lambda s: torch.cat([s[16:], s[:8]]), 16),  # whole pages, pages out of order
        (lambda s: s[:8].flip(0), 8),  # a whole page, slots descending: the general path
        (lambda s: torch.cat([s[:8], s[9:10]]), 16),  # a whole page and part of another
    ],
)
def test_free_of_whole_or_partial_pages(pick: Callable, freed: int) -> None:
    a = TokenToKVPoolAllocator(32, 8)
    slots = a.alloc(24)
    assert a.free(pick(slots)) == freed
    assert a.available_size() == 8 + freed
    a.check_invariants()


def test_free_of_a_whole_page_twice_in_one_call_raises() -> None:
    a = TokenToKVPoolAllocator(32, 8)
    slots = a.alloc(16)
    before = snapshot(a)
    with pytest.raises(ValueError, match="more than once"):
        a.free(torch.cat([slots, slots[:8]]))
    assert snapshot(a) == before


def test_double_free_raises() -> None:
    a = TokenToKVPoolAllocator(8, 1)
    s = a.alloc(2)
    a.free(s)
    before = snapshot(a)
    with pytest.raises(ValueError, match="double free"):
        a.free(s[1:])
    assert snapshot(a) == before


@pytest.mark.parametrize(("n", "error"), [(5, ValueError), (-4, ValueError), (4.0, TypeError)])
def test_bad_alloc_size_names_n(n: object, error: type) -> None:
    a = TokenToKVPoolAllocator(16, 4)
    with pytest.raises(error, match="n must"):
        a.alloc(n)
    assert a.available_size() == 16


def test_bad_construction() -> None:
    with pytest.raises(ValueError, match="size must be a multiple of page_size"):
        TokenToKVPoolAllocator(10, 4)
    with pytest.raises(ValueError, match="page_size"):
        TokenToKVPoolAllocator(16, 0)

    class Pool:
        size, page_size = 32, 4

    with pytest.raises(ValueError, match="kvcache"):
        TokenToKVPoolAllocator(16, 4, kvcache=Pool())
    kv = Pool()
    assert TokenToKVPoolAllocator(32, 4, kvcache=kv).get_kvcache() is kv


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_alloc_on_cuda_and_free_from_cuda() -> None:
    a = TokenToKVPoolAllocator(32, 8, device="cuda")
    slots = a.alloc(16)
    assert slots.device.type == "cuda" and slots.dtype == torch.int64
    assert a.free(slots) == 16 and a.available_size() == 32
    cpu, dev = a.alloc_pair(16)
    assert cpu.device.type == "cpu" and dev.device.type == "cuda"
    assert torch.equal(cpu, dev.cpu()) and a.available_size() == 16


def test_alloc_pair_is_alloc_with_a_cpu_copy() -> None:
    a, b = TokenToKVPoolAllocator(32, 4), TokenToKVPoolAllocator(32, 4)
    cpu, dev = a.alloc_pair(8)
    assert torch.equal(cpu, b.alloc(8)) and torch.equal(dev, cpu)
    assert snapshot(a) == snapshot(b)
    assert a.alloc_pair(28) is None and snapshot(a) == snapshot(b)


def test_check_invariants_detects_corruption() -> None:
    a = TokenToKVPoolAllocator(8, 1)
    a.alloc(2)
    a.corrupt_free_list_for_testing()
    with pytest.raises(RuntimeError, match="twice"):
        a.check_invariants()


@settings(max_examples=60, deadline=None)
@given(
    page_size=st.sampled_from([1, 2, 4]),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(0, 99)), max_size=40),
)
def test_random_alloc_free_matches_model(page_size: int, ops: list) -> None:
    a = TokenToKVPoolAllocator(12 * page_size, page_size)
    owned: list[torch.Tensor] = []
    for is_alloc, pages, pick in ops:
        if is_alloc:
            available = a.available_size()
            got = a.alloc(pages * page_size)
            assert (got is None) == (pages * page_size > available)
            if got is not None:
                owned.append(got)
        elif owned:
            a.free(owned.pop(pick % len(owned)))
        held = torch.cat(owned) if owned else torch.empty(0, dtype=torch.int64)
        assert held.unique().numel() == held.numel()
        assert a.available_size() + held.numel() == 12 * page_size
        free = set(a.free_slots().tolist())
        assert free.isdisjoint(held.tolist()) and min(free | {page_size}) >= page_size
        a.check_invariants()


@settings(max_examples=60, deadline=None)
@given(
    page_size=st.sampled_from([1, 4]),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 4), st.integers(0, 99)), max_size=50),
)
def test_alloc_hands_out_the_free_list_in_order(page_size: int, ops: list) -> None:
    """Pages leave in free-list order, released ones appended sorted when the list runs
    short: the consecutive-run fast path hands out exactly these slots."""
    a = TokenToKVPoolAllocator(10 * page_size, page_size)
    free, released, owned = list(range(1, 11)), [], []  # the model's page lists
    for is_alloc, pages, pick in ops:
        if is_alloc:
            if pages > len(free):
                free, released = free + sorted(released), []
            got = a.alloc(pages * page_size)
            if pages > len(free):
                assert got is None
                continue
            taken, free = free[:pages], free[pages:]
            assert got is not None
            assert got.tolist() == [p * page_size + i for p in taken for i in range(page_size)]
            owned.append(got)
        elif owned:
            slots = owned.pop(pick % len(owned))
            a.free(slots)
            released += sorted({s // page_size for s in slots.tolist()})
        a.check_invariants()


def test_req_to_token_pool() -> None:
    pool = ReqToTokenPool(4, 8, "cpu")
    assert pool.req_to_token.shape == (4, 8) and pool.req_to_token.dtype == torch.int32
    rows = pool.alloc(3)
    assert rows is not None and len(set(rows)) == 3
    assert pool.alloc(2) is None and pool.available_size() == 1
    pool.write((rows[0], slice(0, 3)), torch.tensor([5, 6, 7]))
    assert pool.req_to_token[rows[0], :3].tolist() == [5, 6, 7]
    pool.free(rows[0])
    with pytest.raises(ValueError, match="free_index"):
        pool.free([rows[0]])
    with pytest.raises(ValueError, match="free_index"):
        pool.free([rows[1], rows[1]])
    assert pool.available_size() == 2
    for bad in (True, [rows[1], False], 1.0, ["1"]):
        with pytest.raises(TypeError, match="free_index"):
            pool.free(bad)
    assert pool.available_size() == 2
    pool.free([np.int64(rows[1]), torch.tensor(rows[2])])  # integer-like ids are row ids
    with pytest.raises(ValueError, match="need_size must"):
        pool.alloc(-1)
    pool.clear()
    assert pool.available_size() == 4
