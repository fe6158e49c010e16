"""One tile of the transfer kernel (:mod:`hicache.kernels.transfer_kernel`): address and copy.

- A tile is ``[RH, RP, ROWS, SEG]`` words (8 bytes when the geometry allows, else 4/2/1): lanes
  span a ``SEG``-word segment, warps span items, and each thread makes ``RH * RP`` accesses of 16
  bytes (head slices x segments) at constant offsets from its item's address, all loads of a pass
  in flight before its stores (Triton 3.6 may lay warps across the accesses instead: the same
  traffic with more registers, which is why a thread keeps to 4 accesses).
- An out-of-range index masks its item out, so a bad index on an unchecked CUDA tensor is skipped
  rather than written through.
- Loads are ``evict_first`` and stores streaming (``.cs``), so the copy passes through L2 as
  transient data (measured on an H200: page_first / page_head loads +20-35 %, nothing lost
  elsewhere; see benchmarks/RESULTS.md).

The bodies are untyped on purpose (Triton values and ``tl.constexpr``; see ``[tool.mypy]``).
"""

from __future__ import annotations

import triton
import triton.language as tl

TABLE_CHUNK = tl.constexpr(64)  # pointer-table entries per load in the alignment check


@triton.jit
def row_offsets(idx, PAGE: tl.constexpr, PAGE_STRIDE: tl.constexpr, SLOT_STRIDE: tl.constexpr):
    """Word offset of item ``idx`` (its head 0) from its layer's base."""
    if PAGE == 1:
        return idx * PAGE_STRIDE
    return (idx // PAGE) * PAGE_STRIDE + (idx % PAGE) * SLOT_STRIDE


@triton.jit
def layer_address(addr, layer, IS_TABLE: tl.constexpr, LAYER_BYTES: tl.constexpr):
    """Byte address of one layer: ``table[layer]`` or ``addr + layer * LAYER_BYTES``."""
    addr = addr.to(tl.int64)  # Triton passes a value below 2**31 (a low heap address) as i32
    if IS_TABLE:
        return tl.load(addr.to(tl.pointer_type(tl.int64)) + layer)
    return addr + layer * LAYER_BYTES  # < 2**31: asserted at launch


@triton.jit
def table_misalignment(addr, num_layers, IS_TABLE: tl.constexpr):
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
def copy_rows(
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
