"""One Triton kernel behind every non-direct op.

Shape of the launch (``plan`` from :mod:`hicache.kernels.layouts`):

- A persistent grid of ``min(block_quota, work items)`` programs; program ``p`` walks work items
  ``p, p + grid, ...``. ``num_warps_per_block`` is Triton's ``num_warps`` (threads per program
  ``= num_warps * warp size``), so ``block_quota * num_warps_per_block`` warps is all the copy ever
  occupies.
- A work item is one buffer (K or V) of one layer of one tile of ``ROWS`` items. When both sides
  are layer_first the items walk layer by layer (layer-major), so the host side of an all-layer
  copy is written one layer's region at a time; when a side keeps an item's layers together
  (page_first, page_head) every layer of a tile goes before the next tile (tile-major).
- A tile is ``[RH, RP, ROWS, SEG]`` words (8 bytes when the geometry allows, else 4/2/1): lanes
  span a ``SEG``-word segment, warps span items, and each thread makes ``RH * RP`` accesses of 16
  bytes (head slices x segments) at constant offsets from its item's address, all loads of a pass
  in flight before its stores (Triton 3.6 may lay warps across the accesses instead: the same
  traffic with more registers, which is why a thread keeps to 4 accesses). The next work item's
  indices load before the current one copies.
  An out-of-range index masks its item out, so a bad index on an unchecked CUDA tensor is skipped
  rather than written through.
- Loads are ``evict_first`` and stores streaming (``.cs``), so the copy passes through L2 as
  transient data (measured on an H200: page_first / page_head loads +20-35 %, nothing lost
  elsewhere; see benchmarks/RESULTS.md).
- All buffers travel as raw int64 addresses, cast to pointers inside the kernel: pinned host memory
  and device memory alike (unified addressing), and under ``TRITON_INTERPRET=1`` plain CPU memory.
  When every base and stride is 16-byte aligned the pointers carry ``tl.multiple_of(..., 16)`` so
  loads and stores are 16-byte vectors; pointer tables are checked once per program, and the
  whole copy runs as the vector or as the scalar variant.
- Index pairs are copied in the order given. Scattered pinned reads are fastest in host-address
  order (the GPU's address translation stays local), so HiCacheController sorts each load batch
  by host index once, rather than every per-layer launch sorting again.

Kernels compile lazily per geometry (strides are compile-time constants) and Triton caches them.
"""

from __future__ import annotations

import contextlib
import math

import torch
import triton
import triton.language as tl

from hicache.kernels.layouts import CopyPlan, Operand

ACCESSES_PER_THREAD = 4  # 16-byte loads in flight per thread: 64 KiB per 32-warp program
THREADS_PER_WARP = 32
LINE_BYTES = 128  # the narrowest segment a warp reads at once, where rows allow
TABLE_LIMIT = 1 << 62  # the item bound of a pointer-table side of unknown size: unbounded
TABLE_CHUNK = tl.constexpr(64)  # pointer-table entries per load in the alignment check
_WORD_TYPES = {8: tl.int64, 4: tl.int32, 2: tl.int16, 1: tl.int8}


@triton.jit
def _row_offsets(idx, PAGE: tl.constexpr, PAGE_STRIDE: tl.constexpr, SLOT_STRIDE: tl.constexpr):
    """Word offset of item ``idx`` (its head 0) from its layer's base."""
    if PAGE == 1:
        return idx * PAGE_STRIDE
    return (idx // PAGE) * PAGE_STRIDE + (idx % PAGE) * SLOT_STRIDE


@triton.jit
def _layer_address(addr, layer, IS_TABLE: tl.constexpr, LAYER_BYTES: tl.constexpr):
    """Byte address of one layer: ``table[layer]`` or ``addr + layer * LAYER_BYTES``."""
    addr = addr.to(tl.int64)  # Triton passes a value below 2**31 (a low heap address) as i32
    if IS_TABLE:
        return tl.load(addr.to(tl.pointer_type(tl.int64)) + layer)
    return addr + layer * LAYER_BYTES  # < 2**31: asserted at launch


@triton.jit
def _table_misalignment(addr, num_layers, IS_TABLE: tl.constexpr):
    """OR of ``entry & 15`` over a pointer table's ``num_layers`` entries (0 if not a table)."""
    bad = addr.to(tl.int64) * 0
    if IS_TABLE:
        table = addr.to(tl.int64).to(tl.pointer_type(tl.int64))
        for first in range(0, num_layers, TABLE_CHUNK):
            at = first + tl.arange(0, TABLE_CHUNK)
            entries = tl.load(table + at, mask=at < num_layers, other=0)
            bad = bad | tl.max(entries & 15, axis=0)
    return bad


@triton.jit
def _copy_rows(
    s_addr,
    d_addr,
    s_off,
    d_off,
    ok,
    WORD_TY: tl.constexpr,
    ALIGNED: tl.constexpr,
    HEADS: tl.constexpr,
    PARTS: tl.constexpr,
    S_HEAD_STRIDE: tl.constexpr,
    D_HEAD_STRIDE: tl.constexpr,
    SEG: tl.constexpr,
    RH: tl.constexpr,
    RP: tl.constexpr,
):
    """Copy every item with ``ok`` set: ``HEADS`` slices of ``PARTS`` segments of ``SEG`` words,
    slices ``*_HEAD_STRIDE`` words apart on each side; ``RH`` slices x ``RP`` segments per pass."""
    src = s_addr.to(tl.pointer_type(WORD_TY))
    dst = d_addr.to(tl.pointer_type(WORD_TY))
    if ALIGNED:
        src = tl.multiple_of(src, 16)
        dst = tl.multiple_of(dst, 16)
    src = src + s_off[None, None, :, None]
    dst = dst + d_off[None, None, :, None]
    seg = tl.arange(0, SEG)[None, None, None, :]
    for h0 in tl.static_range(0, HEADS, RH):
        head = h0 + tl.arange(0, RH)[:, None, None, None]
        for p0 in tl.static_range(0, PARTS, RP):
            part = p0 + tl.arange(0, RP)[None, :, None, None]
            mask = ok[None, None, :, None]
            if HEADS % RH != 0:
                mask = mask & (head < HEADS)
            if PARTS % RP != 0:
                mask = mask & (part < PARTS)
            at = part * SEG + seg
            vals = tl.load(
                src + head * S_HEAD_STRIDE + at, mask=mask, eviction_policy="evict_first"
            )
            tl.store(dst + head * D_HEAD_STRIDE + at, vals, mask=mask, cache_modifier=".cs")


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
        s_addr = _layer_address(tl.where(kv == 0, src_k, src_v), layer, S_TABLE, S_LAYER_BYTES)
        d_addr = _layer_address(tl.where(kv == 0, dst_k, dst_v), layer, D_TABLE, D_LAYER_BYTES)
        _copy_rows(
            s_addr,
            d_addr,
            _row_offsets(s_idx, S_PAGE, S_PAGE_STRIDE, S_SLOT_STRIDE),
            _row_offsets(d_idx, D_PAGE, D_PAGE_STRIDE, D_SLOT_STRIDE),
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
def _transfer_kernel(
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
            _table_misalignment(src_k, num_layers, S_TABLE)
            | _table_misalignment(src_v, num_layers, S_TABLE)
            | _table_misalignment(dst_k, num_layers, D_TABLE)
            | _table_misalignment(dst_v, num_layers, D_TABLE)
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
        if not side.is_table:  # table entries: 8-byte aligned (validated), 16 checked in-kernel
            values += _addresses(side)
    return math.gcd(limit, *values)


def _side_constexprs(prefix: str, side: Operand, word: int) -> dict[str, object]:
    g = side.geometry
    return {
        f"{prefix}_TABLE": side.is_table,
        f"{prefix}_PAGE": g.page,
        f"{prefix}_PAGE_STRIDE": g.page_stride // word,
        f"{prefix}_SLOT_STRIDE": g.slot_stride // word,
        f"{prefix}_HEAD_STRIDE": g.head_stride // word,
        f"{prefix}_LAYER_BYTES": g.layer_stride,
    }


def _tile(chunk: int, heads: int, word: int, vector: int, num_warps: int) -> dict[str, int]:
    """The ``[RH, RP, ROWS, SEG]`` tile: about ``ACCESSES_PER_THREAD`` accesses per thread.

    An item is ``heads`` slices of ``chunk`` words. ``SEG``, a power of two dividing ``chunk``
    between one cache line and one warp-wide access (``vector`` bytes a lane), is about an item
    over ``ACCESSES_PER_THREAD``; a pass covers ``RP`` of a slice's ``PARTS`` segments in ``RH``
    slices, and a thread holds ``ACCESSES_PER_THREAD // (RH * RP)`` items, at least one.
    """
    vec = vector // word  # words per access
    target = min(
        THREADS_PER_WARP * vec, max(LINE_BYTES // word, chunk * heads // ACCESSES_PER_THREAD)
    )
    seg = vec
    while seg * 2 <= target and chunk % (seg * 2) == 0:
        seg *= 2
    parts = chunk // seg
    rp = min(ACCESSES_PER_THREAD, triton.next_power_of_2(parts))
    rh = min(max(1, ACCESSES_PER_THREAD // rp), triton.next_power_of_2(heads))
    rows_per_warp = THREADS_PER_WARP // (seg // vec)
    return {
        "HEADS": heads,
        "PARTS": parts,
        "SEG": seg,
        "RH": rh,
        "RP": rp,
        "ROWS": rows_per_warp * num_warps * max(1, ACCESSES_PER_THREAD // (rh * rp)),
    }


def _indices(plan: CopyPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Both index tensors on ``plan.device``."""
    src = plan.src_indices.to(plan.device, non_blocking=True).contiguous()
    dst = plan.dst_indices.to(plan.device, non_blocking=True).contiguous()
    return src, dst


def _layer_major(plan: CopyPlan) -> bool:
    """Walk layer by layer unless a side keeps an item's layers together."""
    return plan.src.geometry.layer_stride == 0 and plan.dst.geometry.layer_stride == 0


def _device_scope(device: torch.device) -> contextlib.AbstractContextManager:
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def launch(plan: CopyPlan, block_quota: int, num_warps: int) -> None:
    """Run ``plan`` with the Triton kernel on ``plan.device`` (the CPU only when interpreting)."""
    if plan.num_items == 0:
        return
    assert (
        plan.num_layers * max(plan.src.geometry.layer_stride, plan.dst.geometry.layer_stride)
        < 2**31
    ), "layer offset overflows"
    word = _alignment(plan, 8)
    align16 = _alignment(plan, 16) == 16
    tile = _tile(plan.chunk // word, plan.heads, word, 16 if align16 else word, num_warps)
    src_idx, dst_idx = _indices(plan)
    limits = [
        side.num_items if side.num_items is not None else TABLE_LIMIT
        for side in (plan.src, plan.dst)
    ]
    work = triton.cdiv(plan.num_items, tile["ROWS"]) * plan.num_layers * plan.num_kv
    with _device_scope(plan.device):
        _transfer_kernel[(min(block_quota, work),)](
            src_idx,
            dst_idx,
            plan.num_items,
            plan.num_layers,
            *_addresses(plan.src),
            *_addresses(plan.dst),
            *limits,
            NUM_KV=plan.num_kv,
            WORD_TY=_WORD_TYPES[word],
            ALIGN16=align16,
            LAYER_MAJOR=_layer_major(plan),
            **tile,
            **_side_constexprs("S", plan.src, word),
            **_side_constexprs("D", plan.dst, word),
            num_warps=num_warps,
        )
