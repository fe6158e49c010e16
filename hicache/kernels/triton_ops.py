"""One Triton kernel behind every non-direct op.

Shape of the launch (``plan`` from :mod:`hicache.kernels.layouts`):

- A persistent grid of ``min(block_quota, tiles)`` programs; program ``p`` walks tiles
  ``p, p + grid, ...``. ``num_warps_per_block`` is Triton's ``num_warps`` (threads per program
  ``= num_warps * warp size``), so ``block_quota * num_warps_per_block`` warps is all the copy ever
  occupies.
- A tile is ``[ROWS, COLS]`` words: ``ROWS`` rows (item, head) in flight at once, each row one
  ``chunk`` of ``WORDS`` words (8 bytes when the geometry allows, else 4/2/1) copied in
  ``N_COL`` column chunks of ``COLS`` (a power of two, masked when padded). A tile is
  ``ACCESSES_PER_THREAD`` accesses per thread. Indices load once per tile and serve every layer
  and both K and V; an out-of-range index masks its row out, so a bad index on an unchecked CUDA
  tensor is skipped rather than written through.
- All buffers travel as raw int64 addresses, cast to pointers inside the kernel: pinned host memory
  and device memory alike (unified addressing), and under ``TRITON_INTERPRET=1`` plain CPU memory.
  When every base and stride is 16-byte aligned the pointers carry ``tl.multiple_of(..., 16)`` so
  loads and stores are 16-byte vectors; addresses read from a pointer table are tested at run time
  and take the vector path when aligned.

Kernels compile lazily per geometry (strides are compile-time constants) and Triton caches them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import triton
import triton.language as tl

from hicache.kernels.layouts import CopyPlan, Operand

ACCESSES_PER_THREAD = 4  # loads in flight per thread and tile (16 B each when aligned)
THREADS_PER_WARP = 32
MIN_COLS = 16  # words: row chunks of at least 128 bytes
TABLE_LIMIT = 1 << 62  # the item bound of a pointer-table side: unknown, so unbounded
_WORD_TYPES = {8: tl.int64, 4: tl.int32, 2: tl.int16, 1: tl.int8}


@triton.jit
def _row_offsets(idx, head, PAGE: tl.constexpr, PAGE_STRIDE: tl.constexpr,
                 SLOT_STRIDE: tl.constexpr, HEAD_STRIDE: tl.constexpr):
    """Word offset of (item ``idx``, head ``head``) from its layer's base."""
    if PAGE == 1:
        return idx * PAGE_STRIDE + head * HEAD_STRIDE
    return (idx // PAGE) * PAGE_STRIDE + (idx % PAGE) * SLOT_STRIDE + head * HEAD_STRIDE


@triton.jit
def _layer_address(addr, layer, IS_TABLE: tl.constexpr, LAYER_BYTES: tl.constexpr):
    """Byte address of one layer: ``table[layer]`` or ``addr + layer * LAYER_BYTES``."""
    addr = addr.to(tl.int64)  # Triton passes a value below 2**31 (a low heap address) as i32
    if IS_TABLE:
        return tl.load(addr.to(tl.pointer_type(tl.int64)) + layer)
    return addr + layer * LAYER_BYTES  # < 2**31: asserted at launch


@triton.jit
def _copy_rows(s_addr, d_addr, s_off, d_off, ok, WORD_TY: tl.constexpr, ALIGNED: tl.constexpr,
               WORDS: tl.constexpr, COLS: tl.constexpr, N_COL: tl.constexpr):
    """Copy ``WORDS`` words of every row with ``ok`` set, ``COLS`` columns at a time.

    The pointers are cast here, inside the caller's branch: ``tl.multiple_of`` marks the op that
    made its operand, so an aligned and an unaligned branch must not share the cast.
    """
    src = s_addr.to(tl.pointer_type(WORD_TY))
    dst = d_addr.to(tl.pointer_type(WORD_TY))
    if ALIGNED:
        src = tl.multiple_of(src, 16)
        dst = tl.multiple_of(dst, 16)
    cols = tl.arange(0, COLS)
    for c in tl.static_range(N_COL):
        col = c * COLS + cols
        mask = ok[:, None] & (col < WORDS)[None, :]
        rows = tl.load(src + s_off[:, None] + col[None, :], mask=mask)
        tl.store(dst + d_off[:, None] + col[None, :], rows, mask=mask)


@triton.jit
def _copy_layer(s_addr, d_addr, s_off, d_off, ok, WORD_TY: tl.constexpr, ALIGN16: tl.constexpr,
                CHECK_ALIGN: tl.constexpr, WORDS: tl.constexpr, COLS: tl.constexpr,
                N_COL: tl.constexpr):
    """One layer of one buffer; 16-byte vectors when ``ALIGN16`` and the bases allow."""
    if ALIGN16 and CHECK_ALIGN:
        if ((s_addr | d_addr) & 15) == 0:
            _copy_rows(s_addr, d_addr, s_off, d_off, ok, WORD_TY, True, WORDS, COLS, N_COL)
        else:
            _copy_rows(s_addr, d_addr, s_off, d_off, ok, WORD_TY, False, WORDS, COLS, N_COL)
    else:
        _copy_rows(s_addr, d_addr, s_off, d_off, ok, WORD_TY, ALIGN16, WORDS, COLS, N_COL)


@triton.jit(do_not_specialize=["n_rows", "num_layers", "src_k", "src_v", "dst_k", "dst_v",
                               "src_limit", "dst_limit"])
def _transfer_kernel(src_idx, dst_idx, n_rows, num_layers, src_k, src_v, dst_k, dst_v,
                     src_limit, dst_limit,
                     HEADS: tl.constexpr, NUM_KV: tl.constexpr, WORD_TY: tl.constexpr,
                     WORDS: tl.constexpr, COLS: tl.constexpr, N_COL: tl.constexpr,
                     ROWS: tl.constexpr, ALIGN16: tl.constexpr,
                     S_TABLE: tl.constexpr, S_PAGE: tl.constexpr, S_PAGE_STRIDE: tl.constexpr,
                     S_SLOT_STRIDE: tl.constexpr, S_HEAD_STRIDE: tl.constexpr,
                     S_LAYER_BYTES: tl.constexpr,
                     D_TABLE: tl.constexpr, D_PAGE: tl.constexpr, D_PAGE_STRIDE: tl.constexpr,
                     D_SLOT_STRIDE: tl.constexpr, D_HEAD_STRIDE: tl.constexpr,
                     D_LAYER_BYTES: tl.constexpr):
    """Rows ``r`` in ``[0, n_rows)``: item ``r // HEADS``, head ``r % HEADS``; strides in words."""
    n_tiles = tl.cdiv(n_rows, ROWS)
    for tile in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        rows = tile * ROWS + tl.arange(0, ROWS)
        live = rows < n_rows
        item = rows // HEADS
        s_idx = tl.load(src_idx + item, mask=live, other=0)
        d_idx = tl.load(dst_idx + item, mask=live, other=0)
        ok = live & (s_idx >= 0) & (s_idx < src_limit) & (d_idx >= 0) & (d_idx < dst_limit)
        s_off = _row_offsets(s_idx, rows % HEADS, S_PAGE, S_PAGE_STRIDE, S_SLOT_STRIDE,
                             S_HEAD_STRIDE)
        d_off = _row_offsets(d_idx, rows % HEADS, D_PAGE, D_PAGE_STRIDE, D_SLOT_STRIDE,
                             D_HEAD_STRIDE)
        for layer in range(num_layers):
            for kv in tl.static_range(NUM_KV):
                if kv == 0:
                    s_addr = _layer_address(src_k, layer, S_TABLE, S_LAYER_BYTES)
                    d_addr = _layer_address(dst_k, layer, D_TABLE, D_LAYER_BYTES)
                else:
                    s_addr = _layer_address(src_v, layer, S_TABLE, S_LAYER_BYTES)
                    d_addr = _layer_address(dst_v, layer, D_TABLE, D_LAYER_BYTES)
                _copy_layer(s_addr, d_addr, s_off, d_off, ok, WORD_TY, ALIGN16,
                            S_TABLE or D_TABLE, WORDS, COLS, N_COL)


def _addresses(side: Operand) -> tuple[int, int]:
    """(K, V) start addresses: the tables themselves, or the data at ``first_layer``."""
    last = len(side.buffers) - 1
    if side.is_table:
        return side.buffers[0].data_ptr(), side.buffers[last].data_ptr()
    return side.base(0), side.base(last)


def _alignment(plan: CopyPlan, limit: int) -> int:
    """Largest power of two dividing ``limit`` (one itself), the chunk, each stride and base."""
    values = [plan.chunk]
    for side in (plan.src, plan.dst):
        values += side.geometry.strides
        if not side.is_table:  # table entries are validated to be 8-byte aligned
            values += _addresses(side)
    return math.gcd(limit, *values)


def _side_constexprs(prefix: str, side: Operand, word: int) -> dict[str, object]:
    g = side.geometry
    return {f"{prefix}_TABLE": side.is_table, f"{prefix}_PAGE": g.page,
            f"{prefix}_PAGE_STRIDE": g.page_stride // word,
            f"{prefix}_SLOT_STRIDE": g.slot_stride // word,
            f"{prefix}_HEAD_STRIDE": g.head_stride // word,
            f"{prefix}_LAYER_BYTES": g.layer_stride}


def _tile(words: int, word: int, vector: int, num_warps: int) -> dict[str, int]:
    """``[ROWS, COLS]`` tile: ``ACCESSES_PER_THREAD`` accesses of ``vector`` bytes per thread.

    ``COLS`` is the power of two >= ``MIN_COLS`` words (or the whole row, if shorter) that pads
    a row least (ties go to the wider); a row is ``N_COL`` column chunks.
    """
    tile_words = num_warps * THREADS_PER_WARP * ACCESSES_PER_THREAD * vector // word
    widest = min(triton.next_power_of_2(words), tile_words)
    narrowest = min(MIN_COLS, widest)
    candidates = [1 << k for k in range(narrowest.bit_length() - 1, widest.bit_length())]
    cols = min(candidates, key=lambda c: (triton.cdiv(words, c) * c, -c))
    return {"WORDS": words, "COLS": cols, "N_COL": triton.cdiv(words, cols),
            "ROWS": max(1, tile_words // cols)}


@contextlib.contextmanager
def _device_scope(device: torch.device) -> Iterator[None]:
    if device.type == "cuda":
        with torch.cuda.device(device):
            yield
    else:
        yield


def launch(plan: CopyPlan, block_quota: int, num_warps: int) -> None:
    """Run ``plan`` with the Triton kernel on ``plan.device`` (the CPU only when interpreting)."""
    n_rows = plan.num_items * plan.heads
    if n_rows == 0:
        return
    assert plan.num_layers * max(plan.src.geometry.layer_stride,
                                 plan.dst.geometry.layer_stride) < 2**31, "layer offset overflows"
    word = _alignment(plan, 8)
    align16 = _alignment(plan, 16) == 16
    tile = _tile(plan.chunk // word, word, 16 if align16 else word, num_warps)
    src_idx = plan.src_indices.to(plan.device, non_blocking=True).contiguous()
    dst_idx = plan.dst_indices.to(plan.device, non_blocking=True).contiguous()
    limits = [side.num_items if side.num_items is not None else TABLE_LIMIT
              for side in (plan.src, plan.dst)]
    grid = (min(block_quota, triton.cdiv(n_rows, tile["ROWS"])),)
    with _device_scope(plan.device):
        _transfer_kernel[grid](
            src_idx, dst_idx, n_rows, plan.num_layers, *_addresses(plan.src),
            *_addresses(plan.dst), *limits, HEADS=plan.heads, NUM_KV=plan.num_kv,
            WORD_TY=_WORD_TYPES[word], ALIGN16=align16, **tile,
            **_side_constexprs("S", plan.src, word), **_side_constexprs("D", plan.dst, word),
            num_warps=num_warps)
