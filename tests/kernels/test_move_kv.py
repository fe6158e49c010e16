"""move_rows_triton / move_rows_native against ``t[tgt] = t.clone()[src]`` on random bytes."""

from __future__ import annotations

import pytest
import torch

from hicache.kernels import move_kv
from hicache.kernels.move_kv import build_move_table, move_rows_native, move_rows_triton
from tests.pools.helpers import DEVICES, fill_random, skip_without_triton

SLOTS = 300


def _buffers(row_bytes: list[int], device: str) -> list[torch.Tensor]:
    bufs = [torch.empty(SLOTS, r, dtype=torch.uint8, device=device) for r in row_bytes]
    fill_random(bufs, seed=sum(row_bytes))
    return bufs


def _moves(n: int, seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` distinct targets and ``n`` sources drawn from the same slots (they overlap)."""
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(SLOTS, generator=gen)[: n + n // 2]
    tgt = slots[:n]
    src = slots[torch.randint(0, slots.numel(), (n,), generator=gen)]
    return tgt.to(device), src.to(device)


def _reference(bufs: list[torch.Tensor], tgt: torch.Tensor, src: torch.Tensor) -> None:
    for b in bufs:
        old = b.clone()
        b[tgt] = old[src]


def _move(path: str, bufs: list[torch.Tensor], tgt: torch.Tensor, src: torch.Tensor) -> None:
    if path == "triton":
        skip_without_triton(str(tgt.device.type))
        move_rows_triton(build_move_table(bufs), tgt, src)
    else:
        move_rows_native(bufs, tgt, src)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", ["triton", "native"])
@pytest.mark.parametrize(
    ("row_bytes", "n"),
    [
        ([32, 32, 16], 7),  # register path, words of 8 bytes, rows of unequal width
        ([1100, 6], 130),  # scratch path, a row of 3 columns, words of 2 bytes
        ([24, 3], 200),  # scratch path over several blocks, words of 1 byte
    ],
)
def test_move_matches_reference(row_bytes: list[int], n: int, path: str, device: str) -> None:
    bufs = _buffers(row_bytes, device)
    want = [b.clone() for b in bufs]
    for seed in (1, 2):  # chained moves
        tgt, src = _moves(n, seed, device)
        _reference(want, tgt, src)
        _move(path, bufs, tgt, src)
    for got, ref in zip(bufs, want, strict=True):
        assert torch.equal(got, ref)


@pytest.mark.parametrize("device", DEVICES)
def test_scratch_split_among_launches(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """With scratch for one column per launch, every column still reads before it writes."""
    skip_without_triton(device)
    bufs = _buffers([16, 16, 8], device)
    table = build_move_table(bufs)
    n = 140
    monkeypatch.setattr(move_kv, "SCRATCH_BYTES", n * table.tile * table.word)
    want = [b.clone() for b in bufs]
    tgt, src = _moves(n, 3, device)
    _reference(want, tgt, src)
    move_rows_triton(table, tgt.to(torch.int32), src)
    for got, ref in zip(bufs, want, strict=True):
        assert torch.equal(got, ref)


def test_table_columns_cover_each_row() -> None:
    bufs = _buffers([1100, 6], "cpu")
    table = build_move_table(bufs)
    assert (table.word, table.tile) == (2, 256)
    assert table.col_width.tolist() == [256, 256, 38, 3]
    assert table.col_stride.tolist() == [550, 550, 550, 3]
    base = bufs[0].data_ptr()
    assert table.col_ptr.tolist() == [base, base + 512, base + 1024, bufs[1].data_ptr()]


def test_table_refuses_non_contiguous_buffers() -> None:
    with pytest.raises(ValueError, match="buffers"):
        build_move_table([torch.zeros(4, 8, dtype=torch.uint8)[:, :4]])
