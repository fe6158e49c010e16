"""The Triton FP4 (E2M1) kernels, launched by :mod:`hicache.kernels.fp4`.

Each program owns ``TILE`` blocks of 16 elements of a contiguous tensor; the arithmetic is the
integer and power-of-two steps of :mod:`hicache.kernels.fp4_reference`, so the results match it
bit for bit. The bodies are untyped on purpose (Triton values and ``tl.constexpr``; see
``[tool.mypy]``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from hicache.kernels.fp4_reference import E2M1_BOUNDS, EXP_BIAS, MIN_EXP

# Compiled kernels read globals only as constexpr (the interpreter is laxer).
_B0, _B1, _B2, _B3, _B4, _B5, _B6 = (tl.constexpr(b) for b in E2M1_BOUNDS)
_BIAS, _MIN_EXP = tl.constexpr(EXP_BIAS), tl.constexpr(MIN_EXP)


@triton.jit
def _codes(x, inv_scale):
    a = tl.abs(x) * inv_scale
    mag = (a >= _B0).to(tl.int32) + (a >= _B1).to(tl.int32) + (a >= _B2).to(tl.int32)
    mag += (a >= _B3).to(tl.int32) + (a >= _B4).to(tl.int32) + (a >= _B5).to(tl.int32)
    mag += (a >= _B6).to(tl.int32)
    return mag | ((x.to(tl.int32, bitcast=True) < 0).to(tl.int32) << 3)


@triton.jit
def _values(codes):
    e = (codes >> 1) & 3
    m = codes & 1
    bits = tl.where(e > 0, ((e + (_BIAS - 1)) << 23) | (m << 22), m * 0x3F000000)
    # times -1.0, not negated: the interpreter's negation turns 0.0 into 0.0, not -0.0
    return bits.to(tl.float32, bitcast=True) * tl.where((codes & 8) != 0, -1.0, 1.0)


@triton.jit
def fp4_quantize_kernel(x_ptr, packed_ptr, scales_ptr, n_blocks, TILE: tl.constexpr):
    """Blocks ``[pid * TILE, (pid + 1) * TILE)``: 16 inputs -> 8 packed bytes and 1 scale."""
    blk = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
    live = blk < n_blocks
    x = tl.load(
        x_ptr + blk[:, None] * 16 + tl.arange(0, 16)[None, :], mask=live[:, None], other=0.0
    ).to(tl.float32)
    bits = tl.max(tl.abs(x), axis=1).to(tl.int32, bitcast=True)
    k = ((bits >> 23) & 0xFF) - (_BIAS + 2) + ((bits & 0x7FFFFF) > 0x400000).to(tl.int32)
    k = tl.maximum(k, _MIN_EXP)
    inv_scale = ((-k + _BIAS) << 23).to(tl.float32, bitcast=True)
    lo, hi = tl.split(tl.reshape(_codes(x, inv_scale[:, None]), (TILE, 8, 2)))
    tl.store(
        packed_ptr + blk[:, None] * 8 + tl.arange(0, 8)[None, :],
        (lo | (hi << 4)).to(tl.uint8),
        mask=live[:, None],
    )
    tl.store(scales_ptr + blk, (k + _BIAS).to(tl.uint8), mask=live)


@triton.jit
def fp4_dequantize_kernel(packed_ptr, scales_ptr, out_ptr, n_blocks, TILE: tl.constexpr):
    """Blocks ``[pid * TILE, (pid + 1) * TILE)``: 8 packed bytes and 1 scale -> 16 outputs."""
    blk = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
    live = blk < n_blocks
    p = tl.load(
        packed_ptr + blk[:, None] * 8 + tl.arange(0, 8)[None, :], mask=live[:, None], other=0
    ).to(tl.int32)
    scale = tl.load(scales_ptr + blk, mask=live, other=0).to(tl.int32)
    scale = (scale << 23).to(tl.float32, bitcast=True)
    values = tl.reshape(tl.join(_values(p & 15), _values(p >> 4)), (TILE, 16))
    tl.store(
        out_ptr + blk[:, None] * 16 + tl.arange(0, 16)[None, :],
        (values * scale[:, None]).to(out_ptr.dtype.element_ty),
        mask=live[:, None],
    )
