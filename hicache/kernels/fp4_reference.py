"""Plain-torch FP4 (E2M1) block quantizer: the reference the Triton kernels match bit for bit.

Format (SGLang's ``FP4MXBlock16KVQuantizeUtil``): blocks of 16 consecutive elements along the
last dim share one uint8 scale byte ``b = k + 127`` meaning ``s = 2**k`` (an E8M0 exponent);
each element is a 4-bit E2M1 code (bit 3 sign, bits 0-2 the index into
``E2M1_VALUES``), two codes per byte, **element ``2i`` in the low nibble** and ``2i + 1`` in the
high one. Every step is integer or exact power-of-two arithmetic on float32, so the torch and
Triton versions agree on every bit.
"""

from __future__ import annotations

import torch

BLOCK = 16  # elements per scale
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitudes of codes 0..7
E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # midpoints: ties round away from zero
MIN_EXP = -33  # SGLang's clamp: amax / 6 >= 1e-10, and ceil(log2(1e-10)) = -33
EXP_BIAS = 127


def scale_exponent(amax_bits: torch.Tensor) -> torch.Tensor:
    """``k = max(MIN_EXP, ceil(log2(amax / 6)))`` exactly, from the int32 bits of a float32
    ``amax >= 0``: with ``amax = M * 2**E``, ``M`` in ``[1, 2)``, ``k = E - 2`` when
    ``M <= 1.5`` and ``E - 1`` otherwise (no rounded division or logarithm)."""
    biased = (amax_bits >> 23) & 0xFF
    above = ((amax_bits & 0x7FFFFF) > 0x400000).to(torch.int32)
    return torch.clamp(biased - (EXP_BIAS + 2) + above, min=MIN_EXP)


def _exp2(k: torch.Tensor) -> torch.Tensor:
    """float32 ``2**k`` for int32 ``k`` in the normal range, built from its bits."""
    return ((k + EXP_BIAS) << 23).view(torch.float32)


def _codes(x: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    """int32 E2M1 codes of float32 ``x`` times ``inv_scale`` (broadcast); the sign bit is
    ``x``'s own, kept even when the magnitude rounds to 0."""
    a = x.abs() * inv_scale
    mag = torch.zeros_like(a, dtype=torch.int32)
    for bound in E2M1_BOUNDS:
        mag += (a >= bound).to(torch.int32)
    sign = (x.view(torch.int32) < 0).to(torch.int32) << 3
    return mag | sign


def quantize_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` (``[..., D]``, ``D % 16 == 0``, floating) to ``(packed, scales)``:
    uint8 ``[..., D // 2]`` and uint8 ``[..., D // 16]`` on ``x``'s device. Unchecked."""
    blocks = x.reshape(-1, BLOCK).to(torch.float32)
    k = scale_exponent(blocks.abs().amax(dim=1).view(torch.int32))
    codes = _codes(blocks, _exp2(-k)[:, None])
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    lead = x.shape[:-1]
    return (
        packed.to(torch.uint8).reshape(*lead, x.shape[-1] // 2),
        (k + EXP_BIAS).to(torch.uint8).reshape(*lead, x.shape[-1] // BLOCK),
    )


def code_values(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of int32 E2M1 ``codes`` (0..15), built from their bits: code
    ``s e1 e0 m`` is ``(-1)**s * 2**(e - 1) * (1 + m / 2)`` for ``e > 0``, ``m / 2`` for
    ``e == 0``; code 8 is ``-0.0``."""
    e, m = (codes >> 1) & 3, codes & 1
    bits = torch.where(e > 0, ((e + EXP_BIAS - 1) << 23) | (m << 22), m * 0x3F000000)
    return bits.view(torch.float32) * torch.where((codes & 8) != 0, -1.0, 1.0)


def dequantize_reference(
    packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``[..., 2 * packed.shape[-1]]`` in ``dtype``: each code's value times its block's
    ``2**(b - 127)`` (byte 0 reads as scale 0.0), rounded once to ``dtype``. Unchecked."""
    p = packed.reshape(-1, BLOCK // 2).to(torch.int32)
    scale = (scales.reshape(-1, 1).to(torch.int32) << 23).view(torch.float32)
    values = torch.stack((code_values(p & 15), code_values(p >> 4)), dim=-1)
    out = values.reshape(-1, BLOCK) * scale
    return out.to(dtype).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
