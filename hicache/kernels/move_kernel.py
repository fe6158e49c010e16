"""The Triton kernel behind ``move_kv_cache`` (launched by :mod:`hicache.kernels.move_kv`).

A *column* is one ``TILE``-word slice of the rows of one layer buffer: its base address (already
offset to the slice), row stride and width come from three tables. Program ``p`` owns column
``col0 + p`` alone, so it may read every source row of its column before writing any target row
and no other program touches those bytes: overlapping source and target sets are safe.

- ``ONE_CHUNK``: all ``n`` rows (``n <= BLOCK_N``) are loaded into registers, then stored.
- Otherwise rows go ``BLOCK_N`` at a time into this program's ``[n, TILE]`` slice of ``scratch``,
  then, after a barrier, from ``scratch`` to the targets.

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
    ONE_CHUNK: tl.constexpr,
):
    """Move rows ``src[i] -> tgt[i]``, ``i < n``, within column ``col0 + program_id``."""
    pid = tl.program_id(0)
    col = col0 + pid
    base = tl.load(col_ptr + col).to(tl.pointer_type(WORD_TY))
    stride = tl.load(col_stride + col)
    words = tl.arange(0, TILE)
    in_tile = words < tl.load(col_width + col)
    rows = tl.arange(0, BLOCK_N)
    if ONE_CHUNK:
        ok = rows < n
        s = tl.load(src + rows, mask=ok, other=0)
        t = tl.load(tgt + rows, mask=ok, other=0)
        mask = ok[:, None] & in_tile[None, :]
        vals = tl.load(base + (s.to(tl.int64)[:, None] * stride + words[None, :]), mask=mask)
        tl.store(base + (t.to(tl.int64)[:, None] * stride + words[None, :]), vals, mask=mask)
    else:
        own = scratch + pid.to(tl.int64) * n * TILE  # this program's [n, TILE] words
        for first in range(0, n, BLOCK_N):
            at = first + rows
            ok = at < n
            s = tl.load(src + at, mask=ok, other=0)
            _rows_copy(base, s, stride, own, at, TILE, words, ok[:, None] & in_tile[None, :])
        tl.debug_barrier()  # every source read (and parked) before any target is written
        for first in range(0, n, BLOCK_N):
            at = first + rows
            ok = at < n
            t = tl.load(tgt + at, mask=ok, other=0)
            _rows_copy(own, at, TILE, base, t, stride, words, ok[:, None] & in_tile[None, :])
