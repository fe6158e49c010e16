"""Shared helpers for the pool tests: pools, random bytes, poison, byte views."""

from __future__ import annotations

import pytest
import torch

from hicache import env
from hicache.pools import MHATokenToKVPool, MLATokenToKVPool

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2]
POISON = 0xA5
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# Where a Triton kernel runs in a test: the GPU when there is one, else CPU tensors under the
# interpreter (tests/conftest.py sets TRITON_INTERPRET=1 on CPU-only machines).
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def skip_without_triton(device: str) -> None:
    """Skip a Triton case on CPU tensors unless the interpreter is on (a GPU machine)."""
    if device == "cpu" and not env.ENV.triton_interpret:
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t`` (last dim widened by the element size), for byte-exact checks."""
    return t.contiguous().view(torch.uint8)


def random_like(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random bytes shaped and typed like ``t`` (never zeros-only; NaN patterns allowed)."""
    raw = torch.randint(0, 256, (t.numel() * t.element_size(),), dtype=torch.uint8, generator=gen)
    return raw.view(t.dtype).view(t.shape).to(t.device)


def fill_random(tensors: list[torch.Tensor], seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    for t in tensors:
        t.copy_(random_like(t, gen))


def poison(t: torch.Tensor) -> None:
    t.view(torch.uint8).fill_(POISON)


def mha_pool(
    size: int = 64,
    page_size: int = 16,
    dtype: torch.dtype = torch.float16,
    device: str = "cpu",
    layers: int = 3,
) -> MHATokenToKVPool:
    return MHATokenToKVPool(size, page_size, dtype, 2, 8, layers, device)


def mla_pool(
    size: int = 64,
    page_size: int = 16,
    dtype: torch.dtype = torch.float16,
    device: str = "cpu",
    layers: int = 3,
) -> MLATokenToKVPool:
    return MLATokenToKVPool(size, page_size, dtype, 16, 8, layers, device)
