"""FP4 (E2M1) block quantization of KV rows: ``quantize_fp4`` and ``dequantize_fp4``.

Format: SGLang's ``FP4MXBlock16KVQuantizeUtil`` (the one its ``MHATokenToKVPoolFP4`` and
``MLATokenToKVPoolFP4`` call). Each block of 16 consecutive elements along the last dim shares a
uint8 scale byte ``b``, the power of two ``s = 2**(b - 127)`` (E8M0); each element is a 4-bit
E2M1 code, sign in bit 3, magnitude ``{0, .5, 1, 1.5, 2, 3, 4, 6}`` in bits 0-2, two per byte
with **element ``2i`` in the low nibble**. Quantizing picks
``s = 2**max(-33, ceil(log2(amax / 6)))`` (``amax`` the block's largest ``|x|``; -33 is
SGLang's clamp) and rounds ``|x| / s`` to the nearest magnitude, ties away from zero; the sign
of ``x`` is kept, so a negative value that rounds to 0 reads back as ``-0.0``.

Error bound (finite inputs). ``s >= amax / 6``, so ``|x| / s <= 6``: nothing clips. The
magnitudes are 0.5 apart up to 2, 1 apart up to 4 and 2 apart up to 6, so
``|x - x_hat| <= s / 4`` where ``|x| <= 2s``, ``<= s / 2`` where ``|x| <= 4s`` and ``<= s``
everywhere. ``s`` is the power of two at or above ``amax / 6`` (computed exactly from
``amax``'s bits, no rounded division or logarithm), hence ``s < amax / 3``, and
``|x - x_hat| <= s <= amax / 3`` for every block with ``amax >= 6 * 2**-33``; smaller blocks
have ``s = 2**-33``. Dequantizing computes ``q * s`` exactly in float32 and rounds it once to
``dtype``: exact for float32 and bfloat16; float16 adds at most half a float16 step where
``q * s < 2**-14`` (its subnormals). One exception: a value that rounds up past ``dtype``'s
largest finite number reads back as ``inf``: ``|x| >= 57344`` (3.5 * 2**14) with a float16
output, ``|x| >= 1.75 * 2**127`` otherwise.

Backend: the Triton kernels on CUDA tensors or under ``TRITON_INTERPRET=1``, the torch
reference otherwise; inside ``hicache.kernels.dispatch.force_backend(name)`` the named one. Both
give the same bits.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from hicache import env
from hicache.kernels.dispatch import forced_backend
from hicache.kernels.fp4_reference import BLOCK, dequantize_reference, quantize_reference

__all__ = ["FLOAT_DTYPES", "dequantize_fp4", "quantize_fp4"]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
TILE = 128  # blocks of 16 per Triton program


def _backend(device: torch.device) -> str:
    name = forced_backend() or (
        "triton" if device.type == "cuda" or env.ENV.triton_interpret else "reference"
    )
    assert name == "reference" or device.type == "cuda" or env.ENV.triton_interpret, (
        "Triton on CPU tensors needs TRITON_INTERPRET=1 set before triton is imported"
    )
    return name


def _check_tensor(name: str, t: Any, dtypes: tuple[torch.dtype, ...], multiple: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {dtypes}, got {t.dtype}")
    if t.dim() == 0 or t.shape[-1] == 0 or t.shape[-1] % multiple:
        raise ValueError(
            f"{name}'s last dim must be a positive multiple of {multiple}, "
            f"got shape {tuple(t.shape)}"
        )


def _launch(name: str, n_blocks: int, device: torch.device, *tensors: torch.Tensor) -> None:
    """Run ``fp4_kernel``'s kernel ``name`` (imported here: only a launch needs Triton)."""
    from hicache.kernels import fp4_kernel

    if n_blocks == 0:
        return
    kernel: Any = getattr(fp4_kernel, name)
    grid = (-(-n_blocks // TILE),)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        kernel[grid](*tensors, n_blocks, TILE=TILE, num_warps=4)


def quantize_fp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` to packed E2M1 codes and per-16-element scale bytes.

    Parameters
    ----------
    x : ``[..., D]`` float16/bfloat16/float32, ``D`` a positive multiple of 16, any device;
        finite (the result of a NaN or inf is unspecified). Not modified.

    Returns
    -------
    packed : uint8 ``[..., D // 2]`` on ``x``'s device (element ``2i`` in the low nibble).
    scales : uint8 ``[..., D // 16]`` on ``x``'s device: ``2**(scales - 127)`` per block.
    """
    _check_tensor("x", x, FLOAT_DTYPES, BLOCK)
    if _backend(x.device) == "reference":
        return quantize_reference(x)
    src = x.contiguous()
    packed = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=torch.uint8, device=x.device)
    scales = torch.empty((*x.shape[:-1], x.shape[-1] // BLOCK), dtype=torch.uint8, device=x.device)
    _launch("fp4_quantize_kernel", scales.numel(), x.device, src, packed, scales)
    return packed, scales


def dequantize_fp4(
    packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """The values ``quantize_fp4`` encoded, in ``dtype`` (within the module's error bound).

    Parameters
    ----------
    packed : uint8 ``[..., D // 2]``, ``D`` a positive multiple of 16.
    scales : uint8 ``[..., D // 16]`` on ``packed``'s device; a byte of 0 reads as scale 0.
    dtype : float16, bfloat16 (default, as SGLang's) or float32.

    Returns
    -------
    A new ``[..., D]`` tensor of ``dtype`` on ``packed``'s device.
    """
    _check_tensor("packed", packed, (torch.uint8,), BLOCK // 2)
    _check_tensor("scales", scales, (torch.uint8,), 1)
    want = (*packed.shape[:-1], packed.shape[-1] * 2 // BLOCK)
    if tuple(scales.shape) != want:
        raise ValueError(f"scales must have shape {want}, got {tuple(scales.shape)}")
    if scales.device != packed.device:
        raise ValueError(f"scales must be on {packed.device}, got {scales.device}")
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of {FLOAT_DTYPES}, got {dtype!r}")
    if _backend(packed.device) == "reference":
        return dequantize_reference(packed, scales, dtype)
    device = packed.device
    out = torch.empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=dtype, device=device)
    src = (packed.contiguous(), scales.contiguous())
    _launch("fp4_dequantize_kernel", scales.numel(), device, *src, out)
    return out
