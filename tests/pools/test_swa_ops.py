"""SWAKVPool's whole-pool operations: sizes, buffer infos, moves and CPU copies of both pools."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import MLATokenToKVPool, SWAKVPool, SWATokenToKVPoolAllocator
from tests.pools.helpers import DEVICES, as_bytes, fill_random
from tests.pools.test_swa_pool import PAGE, SIZE, SIZE_SWA, SWA_IDS, make, poisoned, snapshot


def nbytes(bufs: list[torch.Tensor]) -> int:
    return sum(b.numel() * b.element_size() for b in bufs)


def all_bufs(pool: SWAKVPool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(full pool's buffers, SWA pool's), each K layers then V layers."""
    full, swa = pool.full_kv_pool, pool.swa_kv_pool
    return [*full.k_buffer, *full.v_buffer], [*swa.k_buffer, *swa.v_buffer]


def test_sizes_are_summed_and_infos_split_by_pool() -> None:
    pool, _ = make()
    full, swa = pool.full_kv_pool, pool.swa_kv_pool
    k = nbytes(full.k_buffer) + nbytes(swa.k_buffer)
    v = nbytes(full.v_buffer) + nbytes(swa.v_buffer)
    assert pool.get_kv_size_bytes() == (k, v)
    assert pool.mem_usage == (k + v) / 2**30
    full_bufs, swa_bufs = all_bufs(pool)
    for infos, bufs in ((pool.get_contiguous_buf_infos(), full_bufs),
                        (pool.get_state_buf_infos(), swa_bufs)):  # fmt: skip
        ptrs, lens, items = infos
        assert ptrs == [b.data_ptr() for b in bufs]
        assert lens == [b.numel() * b.element_size() for b in bufs]
        assert items == [b[0].numel() * b.element_size() * PAGE for b in bufs]


def test_mla_sides_count_as_k() -> None:
    mla = {"page_size": PAGE, "kv_lora_rank": 8, "qk_rope_head_dim": 4, "device": "cpu"}
    pool = SWAKVPool(
        SIZE, SIZE_SWA, PAGE, torch.float16, 1, 12, SWA_IDS, [0], "cpu",
        token_to_kv_pool_class=MLATokenToKVPool,
        full_kv_pool_kwargs=mla, swa_kv_pool_kwargs=mla,
    )  # fmt: skip
    want = nbytes(pool.full_kv_pool.kv_buffer) + nbytes(pool.swa_kv_pool.kv_buffer)
    assert pool.get_kv_size_bytes() == (want, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_move_kv_cache_moves_both_pools(device: str) -> None:
    pool, alloc = make(device)
    slots = alloc.alloc(8)
    assert slots is not None
    src, tgt = slots[[0, 1, 4, 5]], slots[[4, 5, 6, 7]]  # overlapping sets
    full_bufs, swa_bufs = all_bufs(pool)
    fill_random(full_bufs + swa_bufs, seed=4)
    want_full, want_swa = snapshot(full_bufs), snapshot(swa_bufs)
    mapping = alloc.full_to_swa_index_mapping
    for want, t, s in ((want_full, tgt, src), (want_swa, mapping[tgt], mapping[src])):
        for w in want:
            w[t] = w.clone()[s]
    pool.move_kv_cache(tgt, src)
    for got, want in zip(full_bufs + swa_bufs, want_full + want_swa, strict=True):
        assert torch.equal(as_bytes(got), as_bytes(want))


@pytest.mark.parametrize(
    ("tgt", "src", "error", "name"),
    [
        (torch.tensor([2, 3]), torch.tensor([4]), ValueError, "equally long"),
        (torch.tensor([2, SIZE + PAGE]), torch.tensor([4, 5]), ValueError, "tgt_loc"),
        (torch.tensor([2, 3]), torch.tensor([4.0, 5.0]), TypeError, "src_loc"),
    ],
)
def test_move_misuse_moves_nothing(
    tgt: torch.Tensor, src: torch.Tensor, error: type, name: str
) -> None:
    pool, alloc = make()
    assert alloc.alloc(8) is not None
    bufs = poisoned(pool)
    fill_random(bufs, seed=5)
    want = snapshot(bufs)
    with pytest.raises(error, match=name):
        pool.move_kv_cache(tgt, src)
    assert all(torch.equal(as_bytes(g), as_bytes(w)) for g, w in zip(bufs, want, strict=True))


def copy_setup(device: str) -> tuple[SWAKVPool, SWATokenToKVPoolAllocator, torch.Tensor]:
    """4 tokens, the first page of them out of the window; random KV in both pools."""
    pool, alloc = make(device)
    old = alloc.alloc(4)
    assert old is not None
    alloc.free_swa(old[:PAGE])
    fill_random([b for bufs in all_bufs(pool) for b in bufs], seed=6)
    return pool, alloc, old


@pytest.mark.parametrize("device", DEVICES)
def test_cpu_copy_round_trip_to_new_slots(device: str) -> None:
    pool, alloc, old = copy_setup(device)
    full_bufs, swa_bufs = all_bufs(pool)
    old_swa = pool.translate_loc_from_full_to_swa(old[PAGE:])
    want_full = [b[old].clone() for b in full_bufs]
    want_swa = [b[old_swa].clone() for b in swa_bufs]
    copy = pool.get_cpu_copy(old)
    assert copy["swa_mask"].tolist() == [False] * PAGE + [True] * (4 - PAGE)
    new = alloc.alloc(4)
    assert new is not None
    bufs = poisoned(pool)
    expected = snapshot(bufs)
    new_swa = pool.translate_loc_from_full_to_swa(new[PAGE:])
    for w, rows in zip(expected[: len(full_bufs)], want_full, strict=True):
        w[new] = rows
    for w, rows in zip(expected[len(full_bufs) :], want_swa, strict=True):
        w[new_swa] = rows
    pool.load_cpu_copy(copy, new)
    assert all(torch.equal(as_bytes(g), as_bytes(w)) for g, w in zip(bufs, expected, strict=True))


def test_load_refused_when_a_windowed_token_has_no_swa_slot() -> None:
    pool, alloc, old = copy_setup("cpu")
    copy = pool.get_cpu_copy(old)
    new = alloc.alloc(4)
    assert new is not None
    alloc.free_swa(new[PAGE:])  # the tokens that had SWA KV have no SWA slot now
    bufs = poisoned(pool)
    want = snapshot(bufs)
    with pytest.raises(ValueError, match="indices"):
        pool.load_cpu_copy(copy, new)
    with pytest.raises(ValueError, match="kv_cache_cpu"):
        pool.load_cpu_copy(copy["full"], new)  # type: ignore[arg-type]
    assert all(torch.equal(as_bytes(g), as_bytes(w)) for g, w in zip(bufs, want, strict=True))


def test_load_with_a_bad_swa_part_writes_nothing() -> None:
    pool, alloc, old = copy_setup("cpu")
    copy = pool.get_cpu_copy(old)
    new = alloc.alloc(4)
    assert new is not None
    copy["swa"] = copy["swa"][:-1]  # a layer short: only the SWA part is wrong
    bufs = poisoned(pool)
    want = snapshot(bufs)
    with pytest.raises(ValueError, match="kv_cache_cpu"):
        pool.load_cpu_copy(copy, new)
    assert all(torch.equal(as_bytes(g), as_bytes(w)) for g, w in zip(bufs, want, strict=True))
