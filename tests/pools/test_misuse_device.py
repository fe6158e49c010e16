"""Issue 12, devices: a CUDA pool on a CPU-only machine, or an unknown device, is a ValueError
naming ``device`` (it was torch's "Torch not compiled with CUDA enabled" AssertionError)."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import (
    MHATokenToKVPool,
    MLATokenToKVPool,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)

BUILDERS = {
    "allocator": lambda device: TokenToKVPoolAllocator(8, 1, device),
    "mha": lambda device: MHATokenToKVPool(8, 1, torch.float16, 2, 8, 2, device),
    "mla": lambda device: MLATokenToKVPool(8, 1, torch.float16, 8, 4, 2, device),
    "req_to_token": lambda device: ReqToTokenPool(4, 8, device),
}
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a CPU-only machine")


@no_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 1)], ids=str)
@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_cuda_on_a_cpu_only_machine(kind, device):
    with pytest.raises(ValueError, match="device=.*CUDA is not available"):
        BUILDERS[kind](device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_a_gpu_this_machine_lacks(kind):
    with pytest.raises(ValueError, match="CUDA device"):
        BUILDERS[kind](f"cuda:{torch.cuda.device_count()}")


@pytest.mark.parametrize(
    "device, exc",
    [
        ("gpu", ValueError),
        ("meta", ValueError),
        ("mps", ValueError),
        (0, TypeError),
        (None, TypeError),
    ],
    ids=repr,
)
@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_unusable_devices(kind, device, exc):
    with pytest.raises(exc, match="device"):
        BUILDERS[kind](device)


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_cpu_spellings_are_one_device(kind):
    assert BUILDERS[kind]("cpu:0").device == BUILDERS[kind](torch.device("cpu")).device


@no_cuda
def test_allocator_refuses_a_kvcache_on_another_device():
    class Pool:  # a duck-typed device pool claiming CUDA
        size, page_size, device = 8, 1, "cuda:0"

    with pytest.raises(ValueError, match="kvcache.device"):
        TokenToKVPoolAllocator(8, 1, "cpu", kvcache=Pool())
