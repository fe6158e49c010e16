"""The page_first_direct ops with several layers per call, as sgl-kernel defines them:
``transfer_kv_per_layer_direct_pf_lf`` loads consecutive layers from ``layer_id``, one per
destination; ``transfer_kv_all_layer_direct_lf_pf`` writes the layers it is given (0 .. m-1).
Random bytes against a per-slot torch reference, destinations poisoned; through ``copy_`` and
through the copy-engine plan (``test_direct``'s ``batches`` fixture)."""

from __future__ import annotations

import pytest
import torch

import hicache.kernels as K
from hicache.kernels.direct import runs
from tests.kernels import test_direct
from tests.kernels.cases import POISON, poisoned, random_bytes
from tests.kernels.test_direct import as_bytes, assert_one_batch, paged_indices

batches = test_direct.batches  # the fixture: the copy_ path, then the copy-engine plan

LAYERS = 4


def slot_shape(mla: bool) -> tuple[int, int]:
    return (1, 24) if mla else (2, 8)


@pytest.mark.parametrize(("layer_id", "m"), [(0, 2), (1, 3), (2, 2), (0, LAYERS)])
@pytest.mark.parametrize("mla", [False, True])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_pf_lf_loads_consecutive_layers_one_per_destination(
    dtype, page_size, mla, layer_id, m, batches
):
    gen = torch.Generator().manual_seed(layer_id * 10 + m + page_size + mla)
    kinds, slot = (1 if mla else 2), slot_shape(mla)
    host = [random_bytes((4, LAYERS, page_size, *slot), dtype, gen) for _ in range(kinds)]
    dev = [poisoned((3 * page_size, *slot), dtype) for _ in range(kinds * m)]
    src_idx = paged_indices(4 * page_size, 2 * page_size, page_size, gen)
    dst_idx = paged_indices(3 * page_size, 2 * page_size, page_size, gen)
    want = as_bytes(dev)
    for k, w in enumerate(want):  # dev[i * m + j] <- layer layer_id + j of host[i]
        h, layer = host[k // m], layer_id + k % m
        for s, d in zip(src_idx.tolist(), dst_idx.tolist(), strict=True):
            w[d] = h[s // page_size, layer, s % page_size].view(torch.uint8)
    K.transfer_kv_per_layer_direct_pf_lf(host, dev, src_idx, dst_idx, layer_id, page_size)
    assert all(torch.equal(a, b) for a, b in zip(as_bytes(dev), want, strict=True))
    assert_one_batch(batches, len(runs(src_idx, dst_idx, src_page=page_size)), kinds * m)


@pytest.mark.parametrize("m", [1, 2, LAYERS])
@pytest.mark.parametrize("mla", [False, True])
@pytest.mark.parametrize("page_size", [1, 4])
def test_lf_pf_writes_the_layers_it_is_given(page_size, mla, m, batches):
    gen = torch.Generator().manual_seed(m * 7 + page_size + mla)
    kinds, slot, dtype = (1 if mla else 2), slot_shape(mla), torch.bfloat16
    dev = [random_bytes((3 * page_size, *slot), dtype, gen) for _ in range(kinds * m)]
    host = [poisoned((4, LAYERS, page_size, *slot), dtype) for _ in range(kinds)]
    src_idx = paged_indices(3 * page_size, 2 * page_size, page_size, gen)
    dst_idx = paged_indices(4 * page_size, 2 * page_size, page_size, gen)
    want = as_bytes(host)  # layers m .. LAYERS-1 stay poisoned
    for k, layer_buf in enumerate(dev):
        w = want[k // m]
        for s, d in zip(src_idx.tolist(), dst_idx.tolist(), strict=True):
            w[d // page_size, k % m, d % page_size] = layer_buf[s].view(torch.uint8)
    K.transfer_kv_all_layer_direct_lf_pf(dev, host, src_idx, dst_idx, page_size)
    assert all(torch.equal(a, b) for a, b in zip(as_bytes(host), want, strict=True))
    assert_one_batch(batches, len(runs(src_idx, dst_idx, dst_page=page_size)), kinds * m)
    if m < LAYERS:
        assert bool((host[0][:, m:].view(torch.uint8) == POISON).all())


def test_pf_lf_refuses_layers_past_the_end_or_uneven_destinations():
    host = [torch.rand(4, LAYERS, 2, 2, 8) for _ in range(2)]
    dev = [poisoned((8, 2, 8), torch.float32) for _ in range(6)]  # 3 layers of k and v
    idx = torch.arange(4)
    with pytest.raises(IndexError, match="layer_id 2 \\+ 3 layers"):
        K.transfer_kv_per_layer_direct_pf_lf(host, dev, idx, idx, 2, 2)
    with pytest.raises(ValueError, match="dst_ptrs must hold a multiple of len.src_ptrs. = 2"):
        K.transfer_kv_per_layer_direct_pf_lf(host, dev[:5], idx, idx, 0, 2)
    assert all(bool((d.view(torch.uint8) == POISON).all()) for d in dev)
    K.transfer_kv_per_layer_direct_pf_lf(host, dev, idx, idx, 1, 2)  # layers 1..3 fit
    assert torch.equal(dev[2][:4], host[0][:2, 3].reshape(4, 2, 8))


def test_direct_pf_lf_plan_takes_one_layer_per_run():
    host = [torch.rand(4, LAYERS, 2, 2, 8) for _ in range(2)]
    idx = torch.arange(4)
    one = [[torch.zeros(8, 2, 8) for _ in range(2)] for _ in range(LAYERS)]
    plan = K.plan_direct_pf_lf(host, one, idx, idx, 2)
    plan.run(3)
    assert torch.equal(one[3][1][:4], host[1][:2, 3].reshape(4, 2, 8))
    two = [[torch.zeros(8, 2, 8) for _ in range(4)] for _ in range(2)]
    with pytest.raises(ValueError, match="one tensor per src_ptrs buffer"):
        K.plan_direct_pf_lf(host, two, idx, idx, 2)
