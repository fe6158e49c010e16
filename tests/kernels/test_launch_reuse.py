"""A launch's preparation and compiled kernel kept across batches: an op called again on the
same buffers skips ``prepare``; a planner's later batches call the kernel compiled for the
first one from their first layer (same specialization), and bind again when it differs."""

from __future__ import annotations

import pytest
import torch

import hicache.kernels as K
from hicache import env
from hicache.kernels import dispatch, layer_plan, triton_ops
from tests.kernels.cases import POISON
from tests.kernels.test_layer_plan import (
    DST_IDX,
    ITEM,
    ITEMS,
    LAYERS,
    SRC_IDX,
    FakeCompiled,
    FakeJit,
    poisoned_layers,
    rand,
)

interpreted = pytest.mark.skipif(
    not env.ENV.triton_interpret, reason="runs Triton on CPU tensors (TRITON_INTERPRET=1)"
)


def _misaligned(idx: torch.Tensor) -> torch.Tensor:
    """``idx``'s values in a tensor 8 bytes past a 16-byte boundary (another specialization)."""
    out = torch.cat([idx[:1], idx])[1:]
    assert out.data_ptr() % 16 == 8
    return out


@interpreted
def test_an_op_on_the_same_buffers_is_prepared_once(monkeypatch) -> None:
    """Every call copies its own indices' bytes; ``prepare`` runs once per buffer set, and
    again after the bounded store was emptied."""
    prepared: list[int] = []
    real = triton_ops.prepare
    monkeypatch.setattr(triton_ops, "prepare", lambda *a: prepared.append(1) or real(*a))
    monkeypatch.setattr(triton_ops, "PREPARED", triton_ops.PreparedLaunches(limit=2))
    src_k, src_v = rand(ITEMS, 2, 4, seed=1), rand(ITEMS, 2, 4, seed=2)
    sets = [poisoned_layers()[:2] for _ in range(3)]

    def copy(dst: list[torch.Tensor], src_idx: torch.Tensor, dst_idx: torch.Tensor) -> None:
        with dispatch.force_backend("triton"):
            K.transfer_kv_per_layer(src_k, dst[0], src_v, dst[1], src_idx, dst_idx, ITEM)
        for got, want in zip(dst, (src_k, src_v), strict=True):
            assert torch.equal(got[dst_idx].view(torch.uint8), want[src_idx].view(torch.uint8))

    copy(sets[0], SRC_IDX, DST_IDX)
    copy(sets[0], SRC_IDX.flip(0), DST_IDX)
    copy(sets[0], _misaligned(SRC_IDX), DST_IDX)
    assert len(prepared) == 1
    copy(sets[1], SRC_IDX, DST_IDX)
    assert len(prepared) == 2
    copy(sets[2], SRC_IDX, DST_IDX)  # a third set: the store (limit 2) starts again
    copy(sets[0], DST_IDX, SRC_IDX)
    assert len(prepared) == 4
    untouched = torch.ones(ITEMS, dtype=torch.bool)
    untouched[SRC_IDX] = untouched[DST_IDX] = False
    assert all(bool((t.view(torch.uint8)[untouched] == POISON).all()) for t in sets[2])


def _planner() -> layer_plan.LayerPlanner:
    src = [{"src_k": rand(ITEMS, 2, 4, seed=j), "src_v": rand(ITEMS, 2, 4, seed=9 + j)}
           for j in range(LAYERS)]  # fmt: skip
    dst = [{"dst_k": k, "dst_v": v}
           for k, v in zip(poisoned_layers(), poisoned_layers(), strict=True)]  # fmt: skip
    return layer_plan.per_layer_planner(src, dst, ITEM)


def _kinds(calls: list) -> list[str]:
    kinds = [kind for kind, _, _ in calls]
    calls.clear()
    return kinds


@interpreted
@pytest.mark.parametrize("fail", [False, True])
def test_a_planner_binds_once_per_specialization_across_batches(monkeypatch, fail) -> None:
    """The second batch calls the first one's compiled kernel from its first layer; indices of
    another alignment bind once more. A compiled kernel that refuses its arguments is dropped:
    every launch then binds."""
    calls: list = []
    monkeypatch.setattr(triton_ops, "transfer_kernel", FakeJit(FakeCompiled(calls, fail)))
    planner = _planner()
    batches = [(SRC_IDX, DST_IDX), (SRC_IDX.flip(0), DST_IDX), (_misaligned(SRC_IDX), DST_IDX)]
    with dispatch.force_backend("triton"):
        kinds = []
        for src_idx, dst_idx in batches:
            plan = planner.plan(src_idx, dst_idx)
            for layer in range(LAYERS):
                plan.run(layer)
            kinds.append(_kinds(calls))
    if fail:
        assert kinds == [["bind"] * LAYERS] * 3
    else:
        first = ["bind"] + ["compiled"] * (LAYERS - 1)
        assert kinds == [first, ["compiled"] * LAYERS, first]


@interpreted
@pytest.mark.parametrize("hook", [False, True])
def test_a_direct_runner_is_bound_once_per_grid_unless_a_hook_is_set(monkeypatch, hook) -> None:
    """Batches of one specialization and grid share one ``direct`` runner; while a launch
    hook (a profiler) is set each batch gets its own (``direct`` then hands the hooked
    runner out)."""
    calls: list = []
    bound: list = []
    monkeypatch.setattr(triton_ops, "transfer_kernel", FakeJit(FakeCompiled(calls, False)))
    real = triton_ops.direct
    monkeypatch.setattr(triton_ops, "direct", lambda *a: bound.append(a[1]) or real(*a))
    monkeypatch.setattr(triton_ops, "hooked", lambda: hook)
    planner = _planner()
    with dispatch.force_backend("triton"):
        for src_idx in (SRC_IDX, SRC_IDX.flip(0), SRC_IDX[:4], SRC_IDX.flip(0)[:4]):
            plan = planner.plan(src_idx, DST_IDX[: len(src_idx)])
            for layer in range(LAYERS):
                plan.run(layer)
    assert len({grid for _, grid, _ in calls}) == 1  # one grid, one specialization
    assert [kind for kind, _, _ in calls].count("bind") == 1  # Triton's binding: once
    assert len(bound) == (4 if hook else 1)  # the direct runner: per batch only while hooked


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_planner_batches_share_one_binding_and_land_their_bytes(monkeypatch) -> None:
    """On the GPU: three batches of one planner bind Triton's kernel once; each lands exactly
    its own rows (random data, poisoned destinations)."""
    binds: list[int] = []
    real = triton_ops.transfer_kernel.run
    monkeypatch.setattr(
        triton_ops.transfer_kernel, "run", lambda *a, **k: binds.append(1) or real(*a, **k)
    )
    layers, items = 4, 64
    src = [{name: rand(items, 2, 4, seed=2 * j + kv).cuda()
            for kv, name in enumerate(("src_k", "src_v"))} for j in range(layers)]  # fmt: skip
    poison = torch.full((items, 2, 8), POISON, dtype=torch.uint8, device="cuda")
    dst = [{name: poison.clone().view(torch.float16) for name in ("dst_k", "dst_v")}
           for _ in range(layers)]  # fmt: skip
    planner = layer_plan.per_layer_planner(src, dst, ITEM)
    perm = torch.randperm(items)
    for b in range(3):
        src_idx, dst_idx = torch.randperm(items)[:16].cuda(), perm[16 * b : 16 * (b + 1)].cuda()
        plan = planner.plan(src_idx, dst_idx)
        for layer in range(layers):
            plan.run(layer)
        torch.cuda.synchronize()
        for layer in range(layers):
            for s, d in (("src_k", "dst_k"), ("src_v", "dst_v")):
                got = dst[layer][d].view(torch.uint8)[dst_idx]
                assert torch.equal(got, src[layer][s].view(torch.uint8)[src_idx])
    assert len(binds) == 1
    written = perm[:48].cuda()
    untouched = torch.ones(items, dtype=torch.bool, device="cuda")
    untouched[written] = False
    assert all(
        bool((t.view(torch.uint8)[untouched] == POISON).all()) for d in dst for t in d.values()
    )
