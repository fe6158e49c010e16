"""Move token slots within a pool's row buffers: ``buf[tgt[i]] = old buf[src[i]]`` for every buffer.

:func:`build_move_table` turns the buffers into column tables once per pool;
:func:`move_rows_triton` moves every buffer of every layer in one launch for up to
``REGISTER_ROWS`` rows, else in a gather and a scatter launch (per group of columns whose scratch
fits ``SCRATCH_BYTES``), so every source is read before its column is written;
:func:`move_rows_native` is the torch path with the same semantics. Both read every source before
writing any target, so ``src`` and ``tgt`` may overlap; ``tgt`` should hold distinct slots (of
repeated targets, one source wins, unspecified which).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TILE_BYTES = 512  # bytes of a column (one program's slice of a row)
REGISTER_ROWS = 128  # moves of up to this many rows stay in registers (no scratch)
BLOCK_ROWS = 32  # rows per step of a scratch move
SCRATCH_BYTES = 256 << 20  # bound on one launch's scratch
NUM_WARPS = 4
_SCRATCH_DTYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16}


def _next_power_of_2(n: int) -> int:
    """The least power of two >= ``n`` (``n >= 1``), as ``triton.next_power_of_2``."""
    return 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class MoveTable:
    """Columns of a pool's row buffers, on the buffers' device.

    Attributes
    ----------
    col_ptr : int64 ``[C]`` address of each column's first word (row 0).
    col_stride : int64 ``[C]`` row stride of its buffer, in words.
    col_width : int32 ``[C]`` words of the column in use (``<= tile``).
    word : bytes of a word (8, 4, 2 or 1): the widest dividing every row and address.
    tile : words of a column (a power of two).
    """

    col_ptr: torch.Tensor
    col_stride: torch.Tensor
    col_width: torch.Tensor
    word: int
    tile: int

    @property
    def num_columns(self) -> int:
        return int(self.col_ptr.numel())


def _word(buffers: list[torch.Tensor]) -> int:
    for word in (8, 4, 2):
        if all(b.data_ptr() % word == 0 and _row_bytes(b) % word == 0 for b in buffers):
            return word
    return 1


def _row_bytes(buf: torch.Tensor) -> int:
    return buf.stride(0) * buf.element_size()


def build_move_table(buffers: list[torch.Tensor]) -> MoveTable:
    """Column tables of ``buffers`` (each contiguous, dim 0 the token slot; one device)."""
    if not buffers or not all(b.is_contiguous() for b in buffers):
        raise ValueError("buffers must be a non-empty list of contiguous tensors")
    word = _word(buffers)
    rows = [_row_bytes(b) // word for b in buffers]
    tile = min(TILE_BYTES // word, _next_power_of_2(max(rows)))
    ptr, stride, width = [], [], []
    for buf, row in zip(buffers, rows, strict=True):
        for first in range(0, row, tile):
            ptr.append(buf.data_ptr() + first * word)
            stride.append(row)
            width.append(min(tile, row - first))
    device = buffers[0].device
    return MoveTable(
        col_ptr=torch.tensor(ptr, dtype=torch.int64, device=device),
        col_stride=torch.tensor(stride, dtype=torch.int64, device=device),
        col_width=torch.tensor(width, dtype=torch.int32, device=device),
        word=word,
        tile=tile,
    )


def move_rows_triton(table: MoveTable, tgt: torch.Tensor, src: torch.Tensor) -> None:
    """Move rows ``src -> tgt`` (equally long 1-D int32/int64 tensors of in-range slots on the
    table's device, checked by the caller) in every column of ``table``; current stream.

    Up to ``REGISTER_ROWS`` rows: one launch, each program moving one column through registers.
    More: a gather launch into scratch, then a scatter launch, over (column, row block), per
    group of columns whose scratch fits ``SCRATCH_BYTES``."""
    import triton.language as tl  # here, not at import: `import hicache` stays free of Triton

    from hicache.kernels.move_kernel import move_kernel

    n = int(tgt.numel())
    if n == 0:
        return
    word_ty = getattr(tl, f"int{table.word * 8}")
    args = (table.col_ptr, table.col_stride, table.col_width, tgt, src, n)
    consts = {"WORD_TY": word_ty, "TILE": table.tile, "num_warps": NUM_WARPS}
    if n <= REGISTER_ROWS:
        grid = (table.num_columns, 1)
        move_kernel[grid](*args, tgt, 0, BLOCK_N=_next_power_of_2(n), PHASE=0, **consts)
        return
    per_launch = max(1, min(table.num_columns, SCRATCH_BYTES // (n * table.tile * table.word)))
    scratch_dtype = _SCRATCH_DTYPES.get(table.word, torch.int8)
    scratch = torch.empty(per_launch * n * table.tile, dtype=scratch_dtype, device=tgt.device)
    for col0 in range(0, table.num_columns, per_launch):
        grid = (min(per_launch, table.num_columns - col0), -(-n // BLOCK_ROWS))
        for phase in (1, 2):
            move_kernel[grid](*args, scratch, col0, BLOCK_N=BLOCK_ROWS, PHASE=phase, **consts)


def move_rows_native(buffers: list[torch.Tensor], tgt: torch.Tensor, src: torch.Tensor) -> None:
    """Torch path of :func:`move_rows_triton`: ``buf[tgt] = buf[src]`` (the gather copies
    first) for each of ``buffers``."""
    if tgt.numel() == 0:
        return
    for buf in buffers:
        buf[tgt] = buf[src]
