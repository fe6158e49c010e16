"""FP4 (E2M1) quantizer: Triton == torch reference bit for bit, the error bound, the format."""

from __future__ import annotations

import math

import pytest
import torch

from hicache.kernels.dispatch import force_backend
from hicache.kernels.fp4 import dequantize_fp4, quantize_fp4
from hicache.kernels.fp4_reference import E2M1_VALUES
from tests.pools.helpers import DEVICES, TRITON_DEVICE, skip_without_triton

FLOATS = [torch.float16, torch.bfloat16, torch.float32]
BACKENDS = ["reference", "triton"]
OVERFLOW_OK = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numpy
SHAPES = [(7, 3, 32), (1, 16), (5, 2, 48), (33, 64)]  # odd row counts, partial last tile
BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}


def random_blocks(shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int = 0):
    """Normal values whose 16-element blocks span magnitudes 2**-12 .. 2**12 (scales vary)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen).reshape(-1, 16)
    x *= torch.exp2(torch.randint(-12, 13, (x.shape[0], 1), generator=gen).float())
    return x.reshape(shape).to(dtype).to(device)


def run(backend: str, fn, *args):
    with force_backend(backend):
        return fn(*args)


def block_scales(scales: torch.Tensor) -> torch.Tensor:
    """float64 ``2**(b - 127)`` per element (each block's scale repeated 16 times)."""
    return torch.exp2(scales.double().cpu() - 127).repeat_interleave(16, dim=-1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_triton_quantize_matches_reference(device, dtype, shape):
    skip_without_triton(device)
    x = random_blocks(shape, dtype, device)
    x.view(-1, 16)[0] = 0  # an all-zero block: the minimum scale
    ref = run("reference", quantize_fp4, x)
    tri = run("triton", quantize_fp4, x)
    for want, got in zip(ref, tri, strict=True):
        assert got.dtype == torch.uint8 and got.device == x.device
        assert torch.equal(got, want)
    assert ref[0].shape == (*shape[:-1], shape[-1] // 2)
    assert ref[1].shape == (*shape[:-1], shape[-1] // 16)


@OVERFLOW_OK
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_triton_dequantize_matches_reference_on_random_bytes(device, dtype):
    skip_without_triton(device)
    gen = torch.Generator().manual_seed(1)
    packed = torch.randint(0, 256, (9, 3, 24), dtype=torch.uint8, generator=gen).to(device)
    # every scale byte but 255 (inf * 0 would be a NaN whose payload is the hardware's)
    scales = torch.randint(0, 255, (9, 3, 3), dtype=torch.uint8, generator=gen).to(device)
    ref = run("reference", dequantize_fp4, packed, scales, dtype)
    tri = run("triton", dequantize_fp4, packed, scales, dtype)
    assert tri.shape == (9, 3, 48) and tri.dtype == dtype and tri.device == packed.device
    assert torch.equal(tri.view(BITS[dtype]), ref.view(BITS[dtype]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_known_block_codes_nibbles_and_scale(backend):
    # |x| / s on the midpoints: ties round away from zero; -0.1 keeps its sign bit
    row = [0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6, -6, -0.1, 1, 2, 3, 4, -0.5]
    x = torch.tensor([row, [2 * v for v in row]], dtype=torch.float32, device=TRITON_DEVICE)
    packed, scales = run(backend, quantize_fp4, x)
    codes = [0x0, 0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7, 0x7, 0xF, 0x8, 0x2, 0x4, 0x5, 0x6, 0x9]
    want = [lo | (hi << 4) for lo, hi in zip(codes[0::2], codes[1::2], strict=True)]
    assert packed.tolist() == [want, want]  # element 2i in the low nibble
    assert scales.tolist() == [[127], [128]]  # amax 6 -> s = 1; amax 12 -> s = 2
    back = run(backend, dequantize_fp4, packed, scales, torch.float32)
    values = [0, 0.5, 1, 1.5, 2, 3, 4, 6, 6, -6, -0.0, 1, 2, 3, 4, -0.5]
    assert back[0].tolist() == values and back[1].tolist() == [2 * v for v in values]
    assert math.copysign(1, back[0, 10].item()) == -1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_error_bound_on_random_data(device, dtype):
    x = random_blocks((64, 4, 32), dtype, device, seed=2)
    packed, scales = quantize_fp4(x)
    err = (x.double().cpu() - dequantize_fp4(packed, scales, dtype).double().cpu()).abs()
    s = block_scales(scales)
    amax = x.double().cpu().abs().reshape(-1, 16).amax(1).repeat_interleave(16).view_as(s)
    assert (s >= amax / 6).all() and (s <= amax / 3).all()  # the scale's own rounding
    mag = x.double().cpu().abs() / s
    assert (err <= s).all()
    assert (err[mag <= 4] <= s[mag <= 4] / 2).all()
    assert (err[mag <= 2] <= s[mag <= 2] / 4).all()
    assert (err > 0).any()  # a lossy format, really quantized


def test_matches_float64_nearest_value_oracle():
    # float32 random data: no value lies exactly on a midpoint, so the nearest value is unique
    x = random_blocks((40, 64), torch.float32, "cpu", seed=3)
    blocks = x.double().reshape(-1, 16)
    s = torch.exp2(torch.ceil(torch.log2(blocks.abs().amax(1, keepdim=True) / 6)))
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    nearest = grid[((blocks.abs() / s)[..., None] - grid).abs().argmin(-1)]
    want = (torch.sign(blocks) * nearest * s).reshape(x.shape)
    got = dequantize_fp4(*quantize_fp4(x), torch.float32)
    assert torch.equal(got.double(), want)


@OVERFLOW_OK
@pytest.mark.parametrize("backend", BACKENDS)
def test_float16_overflow_past_57344_as_documented(backend):
    x = torch.zeros(2, 16, dtype=torch.float16, device=TRITON_DEVICE)
    x[0, 0], x[1, 0] = 57344, 57312  # 3.5 * 2**14 rounds up to 65536; the next lower does not
    back = run(backend, dequantize_fp4, *run(backend, quantize_fp4, x), torch.float16)
    assert back[0, 0].isinf() and back[1, 0] == 49152


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_rows_and_non_contiguous_input(backend):
    packed, scales = run(backend, quantize_fp4, torch.ones(0, 3, 32, device=TRITON_DEVICE))
    assert packed.shape == (0, 3, 16) and scales.shape == (0, 3, 2)
    assert run(backend, dequantize_fp4, packed, scales).shape == (0, 3, 32)
    base = random_blocks((6, 4, 32), torch.bfloat16, TRITON_DEVICE, seed=4)
    view = base[:, 1:3]
    assert not view.is_contiguous()
    got = run(backend, quantize_fp4, view)
    want = run("reference", quantize_fp4, view.contiguous())
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize(
    ("arg", "error", "match"),
    [
        ([1.0] * 16, TypeError, "x must be a torch.Tensor"),
        (torch.ones(2, 16, dtype=torch.int32), TypeError, "x must have dtype"),
        (torch.ones(2, 16, dtype=torch.float64), TypeError, "x must have dtype"),
        (torch.ones(2, 24), ValueError, "x's last dim must be a positive multiple of 16"),
        (torch.tensor(1.0), ValueError, "x's last dim"),
    ],
)
def test_quantize_misuse(arg, error, match):
    with pytest.raises(error, match=match):
        quantize_fp4(arg)


def test_dequantize_misuse():
    packed, scales = quantize_fp4(torch.ones(3, 32))
    with pytest.raises(TypeError, match="packed must have dtype"):
        dequantize_fp4(packed.to(torch.int8), scales)
    with pytest.raises(ValueError, match="packed's last dim"):
        dequantize_fp4(packed[:, :12], scales)
    with pytest.raises(TypeError, match="scales must have dtype"):
        dequantize_fp4(packed, scales.float())
    with pytest.raises(ValueError, match=r"scales must have shape \(3, 2\)"):
        dequantize_fp4(packed, scales[:, :1])
    with pytest.raises(TypeError, match="dtype must be one of"):
        dequantize_fp4(packed, scales, torch.int32)
    with pytest.raises(TypeError, match="dtype must be one of"):
        dequantize_fp4(packed, scales, torch.float8_e4m3fn)
