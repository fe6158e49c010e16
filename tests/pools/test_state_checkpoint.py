"""Recurrent-state checkpoints: copy a row's state out to a slot of its own and back."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import (
    HybridReqToTokenPool,
    checkpoint_states,
    checkpoint_tracked,
    release_states,
    restore_states,
    track_states,
)
from tests.pools.mamba_helpers import FakeReq, params


def pool_with_rows(n: int) -> tuple[HybridReqToTokenPool, list[int]]:
    pool = HybridReqToTokenPool(
        size=4, mamba_size=4, max_context_len=8, device="cpu", cache_params=params()
    )
    rows = pool.alloc(n, [FakeReq() for _ in range(n)])
    assert rows is not None
    return pool, rows


def fill(pool: HybridReqToTokenPool, row: int, value: float) -> None:
    slot = pool.state_slot(row)
    for t in pool.mamba_pool.mamba_cache.tensors():
        t[:, slot] = value


def state_of(pool: HybridReqToTokenPool, row: int) -> list[torch.Tensor]:
    slot = pool.state_slot(row)
    return [t[:, slot].clone() for t in pool.mamba_pool.mamba_cache.tensors()]


def test_checkpoint_survives_the_row_and_restores_into_another() -> None:
    pool, (a, b) = pool_with_rows(2)
    fill(pool, a, 3.0)
    saved = state_of(pool, a)
    ckpt = checkpoint_states(pool, [a])
    assert ckpt is not None and ckpt.dtype == torch.int64 and ckpt.shape == (1,)
    assert int(ckpt) not in (pool.state_slot(a), pool.state_slot(b))
    pool.free(a)
    fill(pool, b, -1.0)
    restore_states(pool, ckpt, [b])
    for got, want in zip(state_of(pool, b), saved, strict=True):
        assert torch.equal(got, want)
    assert pool.mamba_pool.is_allocated(int(ckpt))  # a restore keeps the checkpoint
    release_states(pool, ckpt)
    assert not pool.mamba_pool.is_allocated(int(ckpt))


def test_checkpoint_is_none_when_no_slot_is_free() -> None:
    pool, rows = pool_with_rows(4)  # every state slot held by a row
    assert checkpoint_states(pool, rows[:1]) is None
    assert pool.mamba_pool.available_size() == 0


def test_bad_rows_raise_before_any_copy() -> None:
    pool, (a,) = pool_with_rows(1)
    with pytest.raises(ValueError, match="row"):
        checkpoint_states(pool, [3])  # not allocated
    with pytest.raises(TypeError, match="rows"):
        checkpoint_states(pool, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="req_pool"):
        checkpoint_states(object(), [a])  # type: ignore[arg-type]
    req = FakeReq()
    rows = pool.alloc(1, [req])
    assert rows is not None
    pool.free_mamba_cache(req)
    assert pool.state_slot(rows[0]) is None
    with pytest.raises(ValueError, match="released"):
        checkpoint_states(pool, rows)
    assert pool.mamba_pool.available_size() == 3


def tracked_pool() -> tuple[HybridReqToTokenPool, int, FakeReq]:
    pool = HybridReqToTokenPool(
        size=2,
        mamba_size=8,
        max_context_len=8,
        device="cpu",
        cache_params=params(),
        enable_mamba_extra_buffer=True,
    )
    req = FakeReq()
    rows = pool.alloc(1, [req])
    assert rows is not None
    return pool, rows[0], req


def random_state(pool: HybridReqToTokenPool, slot: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    for t in pool.mamba_pool.mamba_cache.tensors():
        t[:, slot] = torch.randn(t[:, slot].shape, generator=gen).to(t.dtype)
    return [t[:, slot].clone() for t in pool.mamba_pool.mamba_cache.tensors()]


def test_track_states_copies_the_row_state_into_the_named_track_slot() -> None:
    pool, row, _ = tracked_pool()
    first, second = pool.track_slot(row, 0), pool.track_slot(row, 1)
    poison = random_state(pool, second, seed=9)  # the other track slot must stay as it is
    random_state(pool, first, seed=8)
    want = random_state(pool, pool.state_slot(row), seed=7)
    track_states(pool, [row], [0])
    for t, w, p in zip(pool.mamba_pool.mamba_cache.tensors(), want, poison, strict=True):
        assert torch.equal(t[:, first], w) and torch.equal(t[:, second], p)
    ckpt = checkpoint_tracked(pool, row, 0)  # a new slot with the tracked state
    assert ckpt is not None and int(ckpt) not in (first, second, pool.state_slot(row))
    random_state(pool, first, seed=6)  # later tracking does not touch the checkpoint
    for t, w in zip(pool.mamba_pool.mamba_cache.tensors(), want, strict=True):
        assert torch.equal(t[:, int(ckpt)], w)


def test_track_misuse_raises_before_any_copy() -> None:
    pool, row, _ = tracked_pool()
    before = [t.clone() for t in pool.mamba_pool.mamba_cache.tensors()]
    with pytest.raises(ValueError, match="idx must be in"):
        track_states(pool, [row], [2])
    with pytest.raises(ValueError, match="track_idx must hold one index per row"):
        track_states(pool, [row], [0, 1])
    with pytest.raises(ValueError, match="row 1 is not an allocated row"):
        checkpoint_tracked(pool, 1, 0)
    for t, b in zip(pool.mamba_pool.mamba_cache.tensors(), before, strict=True):
        assert torch.equal(t, b)
    plain, rows = pool_with_rows(1)
    with pytest.raises(ValueError, match="needs enable_mamba_extra_buffer"):
        plain.track_slot(rows[0], 0)
