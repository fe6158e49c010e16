"""The Triton kernel behind every non-direct op (launched by :mod:`hicache.kernels.triton_ops`).

A work item is one buffer (K or V) of one layer of one tile of ``ROWS`` items; program ``p`` of a
persistent grid walks work items ``p, p + grid, ...``. When both sides are layer_first the items
walk layer by layer (layer-major), so the host side of an all-layer copy is written one layer's
region at a time; when a side keeps an item's layers together (page_first, page_head) every layer
of a tile goes before the next tile (tile-major). The next work item's indices load before the
current one copies; one tile's copy is :func:`hicache.kernels.transfer_tile.copy_rows`.

All buffers travel as raw int64 addresses, cast to pointers inside the kernel: pinned host memory
and device memory alike (unified addressing), and under ``TRITON_INTERPRET=1`` plain CPU memory.
When every base and stride is 16-byte aligned the pointers carry ``tl.multiple_of(..., 16)`` so
loads and stores are 16-byte vectors; pointer tables are checked once per program, and the whole
copy runs as the vector or as the scalar variant.

The bodies are untyped on purpose (Triton values and ``tl.constexpr``; see ``[tool.mypy]``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from hicache.kernels.transfer_tile import (
    copy_rows,
    layer_address,
    row_offsets,
    table_misalignment,
)


@triton.jit
def _work_item(w, n_tiles, num_layers, NUM_KV: tl.constexpr, LAYER_MAJOR: tl.constexpr):
    """(tile, layer, kv) of work item ``w``; K and V of a tile's layer are neighbours."""
    kv = w % NUM_KV
    rest = w // NUM_KV
    if LAYER_MAJOR:
        layer = rest // n_tiles
        tile = rest - layer * n_tiles
    else:
        tile = rest // num_layers
        layer = rest - tile * num_layers
    return tile, layer, kv


@triton.jit
def _tile_indices(src_idx, dst_idx, tile, live, n_rows, ROWS: tl.constexpr):
    """Source and destination item index of each row of ``tile`` (0 unless ``live``)."""
    rows = tile * ROWS + tl.arange(0, ROWS)
    ok = (rows < n_rows) & live
    return (tl.load(src_idx + rows, mask=ok, other=0), tl.load(dst_idx + rows, mask=ok, other=0))


@triton.jit
def _copy_work(
    src_idx,
    dst_idx,
    n_rows,
    num_layers,
    src_k,
    src_v,
    dst_k,
    dst_v,
    src_limit,
    dst_limit,
    NUM_KV: tl.constexpr,
    WORD_TY: tl.constexpr,
    HEADS: tl.constexpr,
    PARTS: tl.constexpr,
    SEG: tl.constexpr,
    RH: tl.constexpr,
    RP: tl.constexpr,
    ROWS: tl.constexpr,
    ALIGNED: tl.constexpr,
    LAYER_MAJOR: tl.constexpr,
    S_TABLE: tl.constexpr,
    S_PAGE: tl.constexpr,
    S_PAGE_STRIDE: tl.constexpr,
    S_SLOT_STRIDE: tl.constexpr,
    S_HEAD_STRIDE: tl.constexpr,
    S_LAYER_BYTES: tl.constexpr,
    D_TABLE: tl.constexpr,
    D_PAGE: tl.constexpr,
    D_PAGE_STRIDE: tl.constexpr,
    D_SLOT_STRIDE: tl.constexpr,
    D_HEAD_STRIDE: tl.constexpr,
    D_LAYER_BYTES: tl.constexpr,
):
    """Walk this program's work items, each one's indices loaded a work item ahead."""
    n_tiles = tl.cdiv(n_rows, ROWS)
    n_work = n_tiles * num_layers * NUM_KV
    step = tl.num_programs(0)
    first, _first_layer, _first_kv = _work_item(
        tl.program_id(0), n_tiles, num_layers, NUM_KV, LAYER_MAJOR
    )
    s_next, d_next = _tile_indices(src_idx, dst_idx, first, True, n_rows, ROWS)
    for w in range(tl.program_id(0), n_work, step):
        s_idx, d_idx = s_next, d_next
        tile, layer, kv = _work_item(w, n_tiles, num_layers, NUM_KV, LAYER_MAJOR)
        following, _, _ = _work_item(w + step, n_tiles, num_layers, NUM_KV, LAYER_MAJOR)
        s_next, d_next = _tile_indices(src_idx, dst_idx, following, w + step < n_work, n_rows, ROWS)
        rows = tile * ROWS + tl.arange(0, ROWS)
        ok = (
            (rows < n_rows)
            & (s_idx >= 0)
            & (s_idx < src_limit)
            & (d_idx >= 0)
            & (d_idx < dst_limit)
        )
        s_addr = layer_address(tl.where(kv == 0, src_k, src_v), layer, S_TABLE, S_LAYER_BYTES)
        d_addr = layer_address(tl.where(kv == 0, dst_k, dst_v), layer, D_TABLE, D_LAYER_BYTES)
        copy_rows(
            s_addr,
            d_addr,
            row_offsets(s_idx, S_PAGE, S_PAGE_STRIDE, S_SLOT_STRIDE),
            row_offsets(d_idx, D_PAGE, D_PAGE_STRIDE, D_SLOT_STRIDE),
            ok,
            WORD_TY,
            ALIGNED,
            HEADS,
            PARTS,
            S_HEAD_STRIDE,
            D_HEAD_STRIDE,
            SEG,
            RH,
            RP,
        )


@triton.jit(
    do_not_specialize=[
        "n_rows",
        "num_layers",
        "src_k",
        "src_v",
        "dst_k",
        "dst_v",
        "src_limit",
        "dst_limit",
    ]
)
def transfer_kernel(
    src_idx,
    dst_idx,
    n_rows,
    num_layers,
    src_k,
    src_v,
    dst_k,
    dst_v,
    src_limit,
    dst_limit,
    NUM_KV: tl.constexpr,
    WORD_TY: tl.constexpr,
    HEADS: tl.constexpr,
    PARTS: tl.constexpr,
    SEG: tl.constexpr,
    RH: tl.constexpr,
    RP: tl.constexpr,
    ROWS: tl.constexpr,
    ALIGN16: tl.constexpr,
    LAYER_MAJOR: tl.constexpr,
    S_TABLE: tl.constexpr,
    S_PAGE: tl.constexpr,
    S_PAGE_STRIDE: tl.constexpr,
    S_SLOT_STRIDE: tl.constexpr,
    S_HEAD_STRIDE: tl.constexpr,
    S_LAYER_BYTES: tl.constexpr,
    D_TABLE: tl.constexpr,
    D_PAGE: tl.constexpr,
    D_PAGE_STRIDE: tl.constexpr,
    D_SLOT_STRIDE: tl.constexpr,
    D_HEAD_STRIDE: tl.constexpr,
    D_LAYER_BYTES: tl.constexpr,
):
    """Rows ``r`` in ``[0, n_rows)`` are items; strides in words.

    With 16-byte strides and a pointer table, the table entries decide once, per program,
    whether the whole copy runs with 16-byte vectors (each variant its own loop, so the unused
    one costs no registers in the other).
    """
    aligned = ALIGN16
    if ALIGN16 and (S_TABLE or D_TABLE):
        aligned = (
            table_misalignment(src_k, num_layers, S_TABLE)
            | table_misalignment(src_v, num_layers, S_TABLE)
            | table_misalignment(dst_k, num_layers, D_TABLE)
            | table_misalignment(dst_v, num_layers, D_TABLE)
        ) == 0
    if aligned:
        _copy_work(
            src_idx,
            dst_idx,
            n_rows,
            num_layers,
            src_k,
            src_v,
            dst_k,
            dst_v,
            src_limit,
            dst_limit,
            NUM_KV,
            WORD_TY,
            HEADS,
            PARTS,
            SEG,
            RH,
            RP,
            ROWS,
            ALIGN16,
            LAYER_MAJOR,
            S_TABLE,
            S_PAGE,
            S_PAGE_STRIDE,
            S_SLOT_STRIDE,
            S_HEAD_STRIDE,
            S_LAYER_BYTES,
            D_TABLE,
            D_PAGE,
            D_PAGE_STRIDE,
            D_SLOT_STRIDE,
            D_HEAD_STRIDE,
            D_LAYER_BYTES,
        )
    else:
        _copy_work(
            src_idx,
            dst_idx,
            n_rows,
            num_layers,
            src_k,
            src_v,
            dst_k,
            dst_v,
            src_limit,
            dst_limit,
            NUM_KV,
            WORD_TY,
            HEADS,
            PARTS,
            SEG,
            RH,
            RP,
            ROWS,
            False,
            LAYER_MAJOR,
            S_TABLE,
            S_PAGE,
            S_PAGE_STRIDE,
            S_SLOT_STRIDE,
            S_HEAD_STRIDE,
            S_LAYER_BYTES,
            D_TABLE,
            D_PAGE,
            D_PAGE_STRIDE,
            D_SLOT_STRIDE,
            D_HEAD_STRIDE,
            D_LAYER_BYTES,
        )
