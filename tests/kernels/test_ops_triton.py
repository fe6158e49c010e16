"""The Triton kernels on CPU tensors (``TRITON_INTERPRET=1``), forced through the public ops.

Grids stay small: the interpreter costs about a millisecond per program iteration.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hicache import env
from hicache.kernels import plans, transfer_kv_all_layer_mla, transfer_kv_per_layer, triton_ops
from hicache.kernels.dispatch import force_backend
from tests.kernels.cases import (
    PH_SPECS,
    SPECS,
    Config,
    assert_bytes_equal,
    build,
    poisoned,
    random_bytes,
    run,
    table,
)

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or not env.ENV.triton_interpret,
    reason="interpreter tests run on CPU-only machines (TRITON_INTERPRET=1)",
)

SPEC = {s.name: s for s in SPECS}


def run_triton(case, **launch):
    with force_backend("triton"):
        return run(case, **launch)


@pytest.mark.parametrize("dtype", [torch.float16, torch.uint8], ids=str)
@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_kernel_matches_oracle(spec, dtype):
    case = build(spec, Config(dtype=dtype))
    assert_bytes_equal(run_triton(case), case.expected())


@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("spec", PH_SPECS, ids=str)
def test_kernel_page_head_page_sizes(spec, page_size):
    cfg = Config(
        dtype=torch.bfloat16,
        heads=4,
        page_size=page_size,
        src_items=2 * page_size,
        dst_items=2 * page_size,
        n=page_size,
        layers=2,
    )
    case = build(spec, cfg)
    assert_bytes_equal(run_triton(case), case.expected())


@pytest.mark.parametrize("block_quota", [1, 3])
@pytest.mark.parametrize("name", ["transfer_kv_per_layer", "transfer_kv_all_layer_lf_ph"])
def test_persistent_grid_walks_every_tile(name, block_quota):
    """One warp per block makes 32-row tiles, so 150 items are several tiles per program."""
    cfg = Config(dtype=torch.float32, layers=2, page_size=4, src_items=200, dst_items=160, n=150)
    case = build(SPEC[name], cfg)
    got = run_triton(case, block_quota=block_quota, num_warps_per_block=1)
    assert_bytes_equal(got, case.expected())


@pytest.mark.parametrize(
    "name, cfg",
    [
        ("transfer_kv_per_layer_ph_lf", Config(heads=4, head_dim=2, page_size=4)),  # 4-byte slices
        ("transfer_kv_per_layer_pf_lf", Config(dtype=torch.float32, heads=1, head_dim=1024)),
        ("transfer_kv_all_layer_mla_lf_pf", Config(dtype=torch.bfloat16, head_dim=576, layers=2)),
    ],
    ids=["word4", "row_over_tile", "mla576"],
)
def test_unusual_row_widths(name, cfg):
    case = build(SPEC[name], cfg)
    assert_bytes_equal(run_triton(case, num_warps_per_block=1), case.expected())


def offset_copy(tensor: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of ``tensor`` whose data starts ``offset`` bytes into a fresh buffer."""
    nbytes = tensor.numel() * tensor.element_size()
    raw = torch.empty(nbytes + 64, dtype=torch.uint8)
    start = (-raw.data_ptr()) % 64 + offset
    out = raw[start : start + nbytes].view(tensor.dtype).view(tensor.shape)
    return out.copy_(tensor)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_bases_aligned_to_8_not_16(backend):
    """Tensor bases and table entries 8 (not 16) bytes aligned: the kernel's scalar path."""
    gen = torch.Generator().manual_seed(3)
    layers = [offset_copy(random_bytes((16, 2, 8), torch.float16, gen), 8) for _ in range(2)]
    dst = [offset_copy(poisoned((12, 2, 8), torch.float16), 8) for _ in range(2)]
    src_idx, dst_idx = torch.tensor([5, 0, 15, 7]), torch.tensor([11, 3, 0, 4])
    with force_backend(backend):
        transfer_kv_all_layer_mla(table(layers, "cpu"), table(dst, "cpu"), src_idx, dst_idx, 32, 2)
        transfer_kv_per_layer(layers[0], dst[0], layers[1], dst[1], src_idx, dst_idx, 32)
    for layer, out in zip(layers, dst, strict=True):
        assert torch.equal(out[dst_idx].view(torch.uint8), layer[src_idx].view(torch.uint8))
        untouched = torch.ones(12, dtype=torch.bool)
        untouched[dst_idx] = False
        assert bool((out[untouched].view(torch.uint8) == 0xA5).all())


def test_kernel_skips_out_of_range_rows():
    """Indices that escaped validation (unchecked CUDA tensors) are masked, never written."""
    gen = torch.Generator().manual_seed(4)
    src = random_bytes((8, 1, 8), torch.float16, gen)
    dst = poisoned((8, 1, 8), torch.float16)
    ok_src, ok_dst = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 2, 3])
    plan = plans.per_layer({"src": src}, {"dst": dst}, ok_src, ok_dst, 16)
    bad = dataclasses.replace(
        plan, src_indices=torch.tensor([1, 8, -1, 4]), dst_indices=torch.tensor([0, 1, 2, 9])
    )
    triton_ops.launch(bad, block_quota=2, num_warps=1)
    assert torch.equal(dst[0].view(torch.uint8), src[1].view(torch.uint8))
    assert bool((dst[1:].view(torch.uint8) == 0xA5).all())
