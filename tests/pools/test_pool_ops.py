"""Whole-pool ops on MHA and MLA pools: move_kv_cache, CPU copy round trip, buffer infos, sizes."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import KVPool, MHATokenToKVPool
from tests.pools.helpers import (
    DEVICES,
    as_bytes,
    fill_random,
    mha_pool,
    mla_pool,
    poison,
    skip_without_triton,
)

KINDS = {"mha": mha_pool, "mla": mla_pool}
MOVE_DTYPES = [torch.float16, torch.bfloat16, torch.float8_e4m3fn]


class ScaledPool(MHATokenToKVPool):
    """A pool with extra per-token state, made through the ``_create_buffers`` hook."""

    def _create_buffers(self) -> None:
        super()._create_buffers()
        self.k_scale_buffer = self._new_layers((self.num_slots, 3))
        self.v_scale_buffer = self._new_layers((self.num_slots, 3))

    @property
    def row_buffers(self) -> list[list[torch.Tensor]]:
        return [self.k_buffer, self.v_buffer, self.k_scale_buffer, self.v_scale_buffer]


def _pool(kind: str, dtype: torch.dtype, device: str) -> KVPool:
    if kind == "scaled":
        return ScaledPool(64, 16, dtype, 2, 8, 3, device, v_head_dim=4)
    return KINDS[kind](dtype=dtype, device=device)


def _buffers(pool: KVPool) -> list[torch.Tensor]:
    return [b for kind in pool.row_buffers for b in kind]


def _filled(kind: str, dtype: torch.dtype, device: str) -> KVPool:
    pool = _pool(kind, dtype, device)
    fill_random(_buffers(pool), seed=7)
    return pool


def _loc(values: list[int], device: str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("dtype", MOVE_DTYPES)
@pytest.mark.parametrize("kind", ["mha", "mla", "scaled"])
def test_move_kv_cache_matches_reference(
    kind: str, dtype: torch.dtype, native: bool, device: str
) -> None:
    if not native:
        skip_without_triton(device)
    pool = _filled(kind, dtype, device)
    pool.use_native_move_kv_cache = native
    want = [b.clone() for b in _buffers(pool)]
    gen = torch.Generator().manual_seed(3)
    for _ in range(2):  # chained moves; sources and targets overlap
        slots = torch.randperm(pool.num_slots, generator=gen)[:12]
        tgt, src = slots[:8].to(device), slots[4:].to(device)
        for b in want:
            b[tgt] = b.clone()[src]
        pool.move_kv_cache(tgt, src)
    for got, ref in zip(_buffers(pool), want, strict=True):
        assert torch.equal(as_bytes(got), as_bytes(ref))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["mha", "mla", "scaled"])
def test_cpu_copy_round_trip(kind: str, device: str) -> None:
    pool = _filled(kind, torch.bfloat16, device)
    pool.cpu_offloading_chunk_size = 5  # SGLang's per-pool attribute
    indices = _loc([3, 70, 16, 17, 40, 41, 42, 9, 63, 64, 1, 22], device)
    copy = pool.get_cpu_copy(indices)
    assert len(copy) == pool.layer_num and [c[0].shape[0] for c in copy[0]] == [5, 5, 2]
    assert all(t.device.type == "cpu" for layer in copy for c in layer for t in c)
    saved = [b[indices].clone() for b in _buffers(pool)]
    for b in _buffers(pool):
        poison(b)
    pool.load_cpu_copy(copy, indices)
    for b, want in zip(_buffers(pool), saved, strict=True):
        assert torch.equal(as_bytes(b[indices]), as_bytes(want))
        others = torch.ones(pool.num_slots, dtype=torch.bool, device=device)
        others[indices] = False
        assert (b[others].view(torch.uint8) == 0xA5).all()


@pytest.mark.parametrize("kind", ["mha", "mla", "scaled"])
def test_buf_infos_and_sizes_match_tensors(kind: str) -> None:
    pool = _pool(kind, torch.float16, "cpu")
    bufs = _buffers(pool)
    ptrs, lens, items = pool.get_contiguous_buf_infos()
    assert ptrs == [b.data_ptr() for b in bufs]
    assert lens == [b.numel() * b.element_size() for b in bufs]
    assert items == [b[0].numel() * b.element_size() * pool.page_size for b in bufs]
    assert pool.get_state_buf_infos() == ([], [], [])
    total = sum(lens)
    size = pool.get_kv_size_bytes()
    if kind == "mla":
        assert size == total
    else:
        k_side = [pool.k_buffer, getattr(pool, "k_scale_buffer", [])]
        k_bytes = sum(b.numel() * b.element_size() for kind in k_side for b in kind)
        assert size == (k_bytes, total - k_bytes)
    assert pool.mem_usage == pytest.approx(total / 2**30)


BAD_MOVES = [
    ("tgt_loc", lambda d: ([1.0, 2.0], [1, 2]), TypeError),
    ("src_loc", lambda d: ([1, 2], [[1, 2]]), TypeError),
    ("tgt_loc", lambda d: ([1, 80], [1, 2]), ValueError),
    ("src_loc", lambda d: ([1, 2], [-1, 2]), ValueError),
    ("equally long", lambda d: ([1, 2], [1, 2, 3]), ValueError),
]


@pytest.mark.parametrize(("name", "make", "error"), BAD_MOVES)
def test_move_kv_cache_misuse_changes_nothing(name: str, make, error) -> None:  # type: ignore[no-untyped-def]
    pool = _filled("mha", torch.float16, "cpu")
    before = [b.clone() for b in _buffers(pool)]
    tgt, src = make("cpu")
    with pytest.raises(error, match=name):
        pool.move_kv_cache(torch.tensor(tgt), torch.tensor(src))
    with pytest.raises(ValueError, match="src_loc must be on"):
        pool.move_kv_cache(_loc([1], "cpu"), _loc([2], "meta"))
    assert all(
        torch.equal(as_bytes(a), as_bytes(b)) for a, b in zip(_buffers(pool), before, strict=True)
    )


def test_load_cpu_copy_misuse_changes_nothing() -> None:
    pool = _filled("mha", torch.float16, "cpu")
    indices = _loc([3, 4, 5], "cpu")
    copy = pool.get_cpu_copy(indices)
    before = [b.clone() for b in _buffers(pool)]
    copy[1][0][1] = copy[1][0][1][:2]
    with pytest.raises(ValueError, match=r"kv_cache_cpu\[1\]"):
        pool.load_cpu_copy(copy, indices)
    with pytest.raises(ValueError, match="kv_cache_cpu"):
        pool.load_cpu_copy(copy[:2], indices)
    with pytest.raises(TypeError, match="indices"):
        pool.load_cpu_copy(copy, indices.float())
    assert all(
        torch.equal(as_bytes(a), as_bytes(b)) for a, b in zip(_buffers(pool), before, strict=True)
    )
