"""The Triton path on CUDA: host (pinned) and device operands mixed both ways; skipped without CUDA.

Expected bytes come from the per-item oracle or from the CPU reference on CPU copies.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import hicache.kernels as K
from hicache import env
from hicache.kernels.dispatch import force_backend
from tests.kernels.cases import (
    SPECS,
    Config,
    as_bytes,
    assert_bytes_equal,
    build,
    poisoned,
    prepare,
    random_bytes,
    run,
    table,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SPEC = {s.name: s for s in SPECS}
PLACEMENTS = {"h2d": ("pinned", "cuda"), "d2h": ("cuda", "pinned"), "d2d": ("cuda", "cuda")}


def config(spec, **kw) -> Config:
    paged = "ph" in (spec.src, spec.dst)
    return Config(page_size=16 if paged else 1, **kw)


@pytest.mark.parametrize("index_device", ["cuda", "cpu"])
@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.uint8], ids=str)
@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_mixed_host_device(spec, dtype, placement, index_device):
    case = build(spec, config(spec, dtype=dtype))
    got = run(case, *PLACEMENTS[placement], index_device=index_device)
    assert_bytes_equal(got, case.expected())


@pytest.mark.parametrize("placement", ["h2d", "d2h"])
@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_realistic_sizes_match_cpu_reference(spec, placement):
    """2 KiB items (8 heads x 128 bf16; MLA 576), 4 layers, 2048 random slots of 4096."""
    head_dim = 576 if spec.mla else 128
    cfg = Config(
        dtype=torch.bfloat16,
        heads=8,
        head_dim=head_dim,
        layers=4,
        page_size=64,
        src_items=4096,
        dst_items=4096,
        n=2048,
    )
    case = build(spec, cfg)
    assert_bytes_equal(run(case, *PLACEMENTS[placement]), run(case))


@pytest.mark.parametrize("block_quota, num_warps", [(1, 1), (1, 4), (2, 32), (8, 8), (132, 32)])
@pytest.mark.parametrize("name", ["transfer_kv_per_layer_ph_lf", "transfer_kv_all_layer_lf_pf"])
def test_launch_shapes(name, block_quota, num_warps):
    cfg = Config(
        dtype=torch.float16, heads=4, head_dim=64, page_size=16, src_items=512, dst_items=512, n=300
    )
    case = build(SPEC[name], cfg)
    got = run(case, "pinned", "cuda", block_quota=block_quota, num_warps_per_block=num_warps)
    assert_bytes_equal(got, case.expected())


@pytest.mark.parametrize(
    "name, cfg",
    [
        ("transfer_kv_per_layer_ph_lf", Config(heads=4, head_dim=2, page_size=4)),  # 4-byte slices
        ("transfer_kv_per_layer_pf_lf", Config(dtype=torch.float32, heads=1, head_dim=1024)),
        ("transfer_kv_all_layer_mla_lf_pf", Config(dtype=torch.bfloat16, head_dim=576)),
    ],
    ids=["word4", "row_over_tile", "mla576"],
)
def test_unusual_row_widths(name, cfg):
    case = build(SPEC[name], cfg)
    got = run(case, "cuda", "pinned", num_warps_per_block=1)
    assert_bytes_equal(got, case.expected())


def offset_copy(tensor: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of ``tensor`` (same device) starting ``offset`` bytes past a 64-byte boundary."""
    nbytes = tensor.numel() * tensor.element_size()
    raw = torch.empty(nbytes + 64, dtype=torch.uint8, device=tensor.device)
    start = (-raw.data_ptr()) % 64 + offset
    return raw[start : start + nbytes].view(tensor.dtype).view(tensor.shape).copy_(tensor)


def test_tables_and_bases_aligned_to_8_not_16():
    gen = torch.Generator().manual_seed(7)
    src = [offset_copy(random_bytes((64, 2, 8), torch.float16, gen).cuda(), 8) for _ in range(3)]
    dst = [offset_copy(poisoned((64, 2, 8), torch.float16).cuda(), 8) for _ in range(3)]
    src_idx = torch.randperm(64, generator=gen)[:40].cuda()
    dst_idx = torch.randperm(64, generator=gen)[:40].cuda()
    K.transfer_kv_all_layer_mla(table(src, "cuda"), table(dst, "cuda"), src_idx, dst_idx, 32, 3)
    K.transfer_kv_per_layer(src[0], dst[0], src[1], dst[1], src_idx, dst_idx, 32)
    torch.cuda.synchronize()
    for s, d in zip(src, dst, strict=True):
        assert torch.equal(d[dst_idx].view(torch.uint8), s[src_idx].view(torch.uint8))


@pytest.mark.parametrize("placement", ["h2d", "d2d"])
@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_reference_on_cuda_tensors(spec, placement):
    case = build(spec, config(spec))
    with force_backend("reference"):
        got = run(case, *PLACEMENTS[placement], index_device="cuda")
    assert_bytes_equal(got, case.expected())


def test_unpinned_host_memory_is_rejected():
    case = build(SPEC["transfer_kv_per_layer"], Config())
    call = prepare(case, "cpu", "cuda")
    with pytest.raises(ValueError, match="src_k"):
        case.spec.op(**call.kwargs)


def test_cpu_table_with_cuda_data_is_rejected():
    case = build(SPEC["transfer_kv_all_layer_lf_pf"], Config())
    call = prepare(case, "pinned", "cuda")
    kwargs = dict(call.kwargs, src_k_layers=call.kwargs["src_k_layers"].cpu())
    with pytest.raises(ValueError, match="src_k_layers"):
        case.spec.op(**kwargs)


def test_cuda_indices_checked_when_asked(monkeypatch):
    monkeypatch.setattr(env, "ENV", dataclasses.replace(env.ENV, check_device_indices=True))
    case = build(SPEC["transfer_kv_per_layer"], Config())
    call = prepare(case, "cuda", "cuda", index_device="cuda")
    kwargs = dict(call.kwargs, dst_indices=call.kwargs["dst_indices"] + 48)
    before = [as_bytes(b) for b in call.dst]
    with pytest.raises(IndexError, match="dst_indices"):
        case.spec.op(**kwargs)
    assert_bytes_equal([as_bytes(b) for b in call.dst], before)


def test_unchecked_cuda_indices_out_of_range_are_skipped(monkeypatch):
    monkeypatch.setattr(env, "ENV", dataclasses.replace(env.ENV, check_device_indices=False))
    case = build(SPEC["transfer_kv_per_layer"], Config(n=4))
    call = prepare(case, "cuda", "cuda", index_device="cuda")
    bad = call.kwargs["dst_indices"].clone()
    bad[1], bad[2] = 48, -1
    case.spec.op(**dict(call.kwargs, dst_indices=bad))
    torch.cuda.synchronize()
    good = case.dst_indices[[0, 3]]
    src_rows = case.src_indices[[0, 3]]
    for placed, src in zip(call.dst, case.src, strict=True):
        got = placed.cpu()[good].view(torch.uint8)
        assert torch.equal(got, src[src_rows].view(torch.uint8))
        untouched = torch.ones(48, dtype=torch.bool)
        untouched[good] = False
        assert bool((placed.cpu()[untouched].view(torch.uint8) == 0xA5).all())


@pytest.mark.parametrize("placement", ["h2d", "d2h"])
def test_direct_ops_across_host_and_device(placement):
    src_dev, dst_dev = PLACEMENTS[placement]
    gen = torch.Generator().manual_seed(11)
    page, layers = 16, 3
    place = {"pinned": lambda t: t.pin_memory(), "cuda": lambda t: t.cuda()}
    lf = [random_bytes((128, 2, 8), torch.bfloat16, gen) for _ in range(2 * layers)]
    pfd = [random_bytes((8, layers, page, 2, 8), torch.bfloat16, gen) for _ in range(2)]
    idx_a = (torch.randperm(8, generator=gen)[:4, None] * page + torch.arange(page)).flatten()
    idx_b = (torch.randperm(8, generator=gen)[:4, None] * page + torch.arange(page)).flatten()
    # layer_first <-> layer_first
    src = [place[src_dev](t.clone()) for t in lf[:2]]
    dst = [place[dst_dev](torch.zeros_like(t)) for t in lf[:2]]
    K.transfer_kv_direct(src, dst, idx_a, idx_b, page)
    torch.cuda.synchronize()
    for s, d in zip(lf[:2], dst, strict=True):
        assert torch.equal(d.cpu()[idx_b].view(torch.uint8), s[idx_a].view(torch.uint8))
    # page_first_direct host -> device layer, and all device layers -> host
    dev = [torch.zeros(128, 2, 8, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    host = [t.clone().pin_memory() for t in pfd]
    K.transfer_kv_per_layer_direct_pf_lf(host, dev, idx_a, idx_b.cuda(), 1, page)
    dev_layers = [t.cuda() for t in lf]
    K.transfer_kv_all_layer_direct_lf_pf(dev_layers, host, idx_b.cuda(), idx_a, page)
    torch.cuda.synchronize()
    for h, d in zip(pfd, dev, strict=True):
        want = h[idx_a // page, 1, idx_a % page]
        assert torch.equal(d.cpu()[idx_b].view(torch.uint8), want.view(torch.uint8))
    for k, layer in enumerate(lf):
        got = host[k // layers][idx_a // page, k % layers, idx_a % page]
        assert torch.equal(got.view(torch.uint8), layer[idx_b].view(torch.uint8))
