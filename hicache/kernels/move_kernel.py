"""The Triton kernel behind ``move_kv_cache`` (launched by :mod:`hicache.kernels.move_kv`).

A *column* is one ``TILE``-word slice of the rows of one layer buffer: its base address (already
offset to the slice), row stride and width come from three tables. Program ``p`` owns column
``col0 + p`` (phase 0) or a block of its rows (phases 1 and 2).

- ``PHASE`` 0: all ``n`` rows (``n <= BLOCK_N``) are loaded into registers, then stored; one
  program per column.
- Otherwise two launches over (column, ``BLOCK_N`` rows): phase 1 gathers the sources into the
  column's ``[n, TILE]`` slice of ``scratch``, phase 2 (queued after it on the same stream)
  scatters them to the targets, so every source is read before any target is written.

The bodies are untyped on purpose (Triton values and ``tl.constexpr``; see ``[tool.mypy]``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rows_copy(src_base, src_rows, src_stride, dst_base, dst_rows, dst_stride, words, mask):
    """``dst[dst_rows, words] = src[src_rows, words]`` where ``mask`` is set."""
    s = src_rows.to(tl.int64)[:, None] * src_stride + words[None, :]
    d = dst_rows.to(tl.int64)[:, None] * dst_stride + words[None, :]
    vals = tl.load(src_base + s, mask=mask, eviction_policy="evict_first")
    tl.store(dst_base + d, vals, mask=mask)


@triton.jit(do_not_specialize=["n", "col0"])
def move_kernel(
    col_ptr,
    col_stride,
    col_width,
    tgt,
    src,
    n,
    scratch,
    col0,
    WORD_TY: tl.constexpr,
    TILE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PHASE: tl.constexpr,
):
    """Rows ``src[i] -> tgt[i]``, ``i < n``, of column ``col0 + program_id(0)``; rows
    ``program_id(1) * BLOCK_N ...`` of it in the gather (``PHASE`` 1) and scatter (2) phases."""
    pid = tl.program_id(0)
    col = col0 + pid
    base = tl.load(col_ptr + col).to(tl.pointer_type(WORD_TY))
    stride = tl.load(col_stride + col)
    words = tl.arange(0, TILE)
    at = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = at < n
    mask = ok[:, None] & (words < tl.load(col_width + col))[None, :]
    own = scratch + pid.to(tl.int64) * n * TILE  # this column's [n, TILE] words of scratch
    if PHASE == 0:  # all n rows in registers: every load before any store
        s = tl.load(src + at, mask=ok, other=0)
        t = tl.load(tgt + at, mask=ok, other=0)
        vals = tl.load(base + (s.to(tl.int64)[:, None] * stride + words[None, :]), mask=mask)
        tl.store(base + (t.to(tl.int64)[:, None] * stride + words[None, :]), vals, mask=mask)
    elif PHASE == 1:  # gather the sources into scratch
        s = tl.load(src + at, mask=ok, other=0)
        _rows_copy(base, s, stride, own, at, TILE, words, mask)
    else:  # scatter scratch to the targets (launched after every gather of these columns)
        t = tl.load(tgt + at, mask=ok, other=0)
        _rows_copy(own, at, TILE, base, t, stride, words, mask)
