"""The plan-once forms of the per-layer ops: each layer's run equals the op's call, and a plan
checks once what the op checks on every call."""

from __future__ import annotations

import pytest
import torch
import triton
from triton.compiler import CompiledKernel

import hicache.kernels as K
from hicache import env
from hicache.kernels import direct_plan, dispatch, layer_plan, triton_ops
from tests.kernels.cases import POISON

LAYERS, ITEMS, HEADS, DIM, PAGE = 3, 16, 2, 4, 4
ITEM = HEADS * DIM * 2  # float16


def rand(*shape: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (torch.Size(shape).numel() * 2,), dtype=torch.uint8, generator=gen)
    return raw.view(torch.float16).view(shape)


def poisoned_layers() -> list[torch.Tensor]:
    return [torch.full((ITEMS, HEADS, DIM * 2), POISON, dtype=torch.uint8).view(torch.float16)
            for _ in range(LAYERS)]  # fmt: skip


SRC_IDX = torch.tensor([5, 2, 9, 14])
DST_IDX = torch.tensor([1, 7, 3, 12])


def test_plan_per_layer_equals_the_op() -> None:
    src_k = [rand(ITEMS, HEADS, DIM, seed=layer) for layer in range(LAYERS)]
    src_v = [rand(ITEMS, HEADS, DIM, seed=10 + layer) for layer in range(LAYERS)]
    planned_k, planned_v, called_k, called_v = (poisoned_layers() for _ in range(4))
    plan = K.plan_per_layer(
        [{"src_k": k, "src_v": v} for k, v in zip(src_k, src_v, strict=True)],
        [{"dst_k": k, "dst_v": v} for k, v in zip(planned_k, planned_v, strict=True)],
        SRC_IDX,
        DST_IDX,
        ITEM,
    )
    for layer in range(LAYERS):
        plan.run(layer)
        K.transfer_kv_per_layer(
            src_k[layer], called_k[layer], src_v[layer], called_v[layer], SRC_IDX, DST_IDX, ITEM
        )
    for got, want in zip(planned_k + planned_v, called_k + called_v, strict=True):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(planned_k[1][DST_IDX].view(torch.uint8), src_k[1][SRC_IDX].view(torch.uint8))


def test_plan_pf_lf_equals_the_op() -> None:
    src = rand(ITEMS, LAYERS, 1, DIM * HEADS, seed=1)
    planned = [layer.view(ITEMS, 1, HEADS * DIM) for layer in poisoned_layers()]
    called = [layer.view(ITEMS, 1, HEADS * DIM) for layer in poisoned_layers()]
    plan = K.plan_per_layer_pf_lf(
        {"src": src}, [{"dst": t} for t in planned], SRC_IDX, DST_IDX, ITEM, ITEM * LAYERS
    )
    for layer in range(LAYERS):
        plan.run(layer)
        K.transfer_kv_per_layer_mla_pf_lf(
            src, called[layer], SRC_IDX, DST_IDX, layer, ITEM, ITEM * LAYERS
        )
    assert all(
        torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        for a, b in zip(planned, called, strict=True)
    )


def test_plan_direct_equals_the_op() -> None:
    src = [[rand(ITEMS, HEADS, DIM, seed=layer)] for layer in range(LAYERS)]
    planned = [[layer] for layer in poisoned_layers()]
    called = [[layer] for layer in poisoned_layers()]
    idx_src, idx_dst = torch.arange(4, 12), torch.tensor([12, 13, 14, 15, 4, 5, 6, 7])
    plan = K.plan_direct(src, planned, idx_src, idx_dst, PAGE)
    for layer in range(LAYERS):
        plan.run(layer)
        K.transfer_kv_direct(src[layer], called[layer], idx_src, idx_dst, PAGE)
    assert plan.runs.as_list() == [(4, 12, 4), (8, 4, 4)]
    for (a,), (b,) in zip(planned, called, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_plans_refuse_a_bad_layer_id() -> None:
    layers = [{"src": rand(ITEMS, 1, 8, seed=layer)} for layer in range(LAYERS)]
    dst = [{"dst": layer.view(ITEMS, 1, 8)} for layer in poisoned_layers()]
    kernel = K.plan_per_layer(layers, dst, SRC_IDX, DST_IDX, 16)
    direct = K.plan_direct(
        [[t["src"]] for t in layers], [[t["dst"]] for t in dst], SRC_IDX, DST_IDX, PAGE
    )
    for plan in (kernel, direct):
        with pytest.raises(IndexError, match="layer_id"):
            plan.run(LAYERS)
        with pytest.raises(TypeError, match="layer_id"):
            plan.run(True)
    assert all((t["dst"].view(torch.uint8) == POISON).all() for t in dst)


def test_a_layer_unlike_layer_0_is_refused_at_plan_time() -> None:
    src = [{"src": rand(ITEMS, 1, 8, seed=layer)} for layer in range(LAYERS)]
    dst = [{"dst": layer.view(ITEMS, 1, 8)} for layer in poisoned_layers()]
    dst[2] = {"dst": dst[2]["dst"][: ITEMS // 2]}
    with pytest.raises(ValueError, match=r"dst_layers\[2\]"):
        K.plan_per_layer(src, dst, SRC_IDX, DST_IDX, 16)
    with pytest.raises(ValueError, match=r"dst_layers\[2\]"):
        K.plan_direct([[t["src"]] for t in src], [[t["dst"]] for t in dst], SRC_IDX, DST_IDX, 4)
    with pytest.raises(ValueError, match="differ in length"):
        K.plan_per_layer(src, dst[:2], SRC_IDX, DST_IDX, 16)
    with pytest.raises(IndexError, match="src_indices"):
        K.plan_per_layer(src, dst[:1] * LAYERS, SRC_IDX + ITEMS, DST_IDX, 16)


def _cuda_plan(layers: int, items: int, src_idx: torch.Tensor, dst_idx: torch.Tensor):
    """Random K/V source layers, poisoned destination layers on CUDA, and their per-layer plan."""
    src = [[rand(items, HEADS, DIM, seed=2 * layer + kv).cuda() for kv in range(2)]
           for layer in range(layers)]  # fmt: skip
    dst = [[torch.full((items, HEADS, DIM * 2), POISON, dtype=torch.uint8, device="cuda")
            .view(torch.float16) for _ in range(2)] for _ in range(layers)]  # fmt: skip
    plan = K.plan_per_layer(
        [{"src_k": k, "src_v": v} for k, v in src],
        [{"dst_k": k, "dst_v": v} for k, v in dst],
        src_idx,
        dst_idx,
        ITEM,
    )
    return src, dst, plan


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_plan_binds_the_kernel_once_and_copies_every_layer(monkeypatch) -> None:
    """After the first layer the compiled kernel is called directly (Triton binds the
    arguments once per plan); every layer lands its own bytes and nothing else."""
    binds: list[int] = []
    real = triton_ops.transfer_kernel.run
    monkeypatch.setattr(
        triton_ops.transfer_kernel, "run", lambda *a, **k: binds.append(1) or real(*a, **k)
    )
    layers, items = 8, 64
    src_idx, dst_idx = torch.randperm(items)[:40].cuda(), torch.randperm(items)[:40].cuda()
    src, dst, plan = _cuda_plan(layers, items, src_idx, dst_idx)
    for layer in reversed(range(layers)):
        plan.run(layer)
    torch.cuda.synchronize()
    assert len(binds) == 1
    untouched = torch.ones(items, dtype=torch.bool, device="cuda")
    untouched[dst_idx] = False
    for layer in range(layers):
        for kv in range(2):
            got = dst[layer][kv].view(torch.uint8)
            assert torch.equal(got[dst_idx], src[layer][kv][src_idx].view(torch.uint8))
            assert bool((got[untouched] == POISON).all())


class FakeCompiled(CompiledKernel):
    """Stands in for Triton's compiled kernel: its launcher ``run(x, y, z, stream, function,
    metadata, launch_metadata, enter_hook, exit_hook, *args)`` as Triton's runner calls it
    (every parameter in signature order), and ``kernel[grid]``, Triton's runner (needed per
    layer only while a launch hook is set)."""

    function = "cu-function"
    packed_metadata = ("packed",)

    def __init__(self, calls: list, fail: bool) -> None:  # no super(): nothing is compiled
        self.calls, self.fail = calls, fail

    def run(self, x, y, z, stream, function, metadata, launch_metadata, enter, exit_, *args):
        assert all(isinstance(g, int) for g in (x, y, z)) and isinstance(stream, int)
        assert (function, metadata) == (self.function, self.packed_metadata)
        assert (launch_metadata, enter, exit_) == (None, None, None)
        if self.fail:
            raise IndexError("a launcher that takes other arguments")
        self.calls.append(("compiled", (x, y, z), args))

    def __getitem__(self, grid):
        def runner(*args, stream=None):
            self.calls.append(("runner", grid, args))

        return runner


class FakeJit:
    """Stands in for ``transfer_kernel``: ``kernel[grid](*args, num_warps=...)`` records the
    call and returns ``compiled``."""

    def __init__(self, compiled: FakeCompiled) -> None:
        self.arg_names = triton_ops.transfer_kernel.arg_names
        self.compiled = compiled

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            assert set(kwargs) == {"num_warps"}
            self.compiled.calls.append(("bind", grid, args))
            return self.compiled

        return launch


def _run_every_layer() -> tuple[list[dict], list[dict]]:
    """Plan and run a per-layer copy of random buffers, every layer, on the Triton route."""
    src = [{name: rand(ITEMS, HEADS, DIM, seed=layer) for name in ("src_k", "src_v")}
           for layer in range(LAYERS)]  # fmt: skip
    dst = [{name: rand(ITEMS, HEADS, DIM, seed=layer) for name in ("dst_k", "dst_v")}
           for layer in range(LAYERS)]  # fmt: skip
    plan = K.plan_per_layer(src, dst, SRC_IDX, DST_IDX, ITEM)
    with dispatch.force_backend("triton"):
        for layer in range(LAYERS):
            plan.run(layer)
    return src, dst


@pytest.mark.skipif(
    not env.ENV.triton_interpret,
    reason="fakes the compiled kernel on CPU tensors (TRITON_INTERPRET=1, set without a GPU); "
    "test_cuda_plan_binds_the_kernel_once_and_copies_every_layer covers CUDA",
)
@pytest.mark.parametrize("fail", [False, True])
def test_plan_binds_once_then_calls_the_compiled_kernel_per_layer(monkeypatch, fail) -> None:
    """Layer 0 goes through Triton's binding; later layers call its compiled kernel with the
    same arguments but their own four buffer addresses. A compiled kernel that refuses its
    arguments makes the plan bind every launch instead."""
    calls: list = []
    monkeypatch.setattr(triton_ops, "transfer_kernel", FakeJit(FakeCompiled(calls, fail)))
    src, dst = _run_every_layer()
    kinds = [kind for kind, _, _ in calls]
    assert kinds == (["bind"] * LAYERS if fail else ["bind"] + ["compiled"] * (LAYERS - 1))
    names = list(triton_ops.transfer_kernel.arg_names)
    where = [names.index(n) for n in ("src_k", "src_v", "dst_k", "dst_v")]
    for layer, (_, grid, args) in enumerate(calls):
        assert len(args) == len(names)
        want = [src[layer]["src_k"], src[layer]["src_v"], dst[layer]["dst_k"], dst[layer]["dst_v"]]
        assert [args[j] for j in where] == [t.data_ptr() for t in want]
        rest = [a for j, a in enumerate(args) if j not in where]
        first = [a for j, a in enumerate(calls[0][2]) if j not in where]
        assert all(a is b for a, b in zip(rest, first, strict=True))  # nothing else per layer
        assert grid == calls[0][1]


def test_layer_addresses_are_those_of_the_layers_plan() -> None:
    """What the launcher is built from equals each layer's own plan, for a layer_first and a
    page_first source."""
    lf = K.plan_per_layer(
        [{"src_k": rand(ITEMS, HEADS, DIM, seed=j), "src_v": rand(ITEMS, HEADS, DIM, seed=9)}
         for j in range(LAYERS)],  # fmt: skip
        [{"dst_k": k, "dst_v": v}
         for k, v in zip(poisoned_layers(), poisoned_layers(), strict=True)],
        SRC_IDX, DST_IDX, ITEM,
    )  # fmt: skip
    src = {"src": rand(ITEMS, LAYERS, 1, DIM * HEADS, seed=1)}
    dst = [{"dst": layer.view(ITEMS, 1, HEADS * DIM)} for layer in poisoned_layers()]
    pf = K.plan_per_layer_pf_lf(src, dst, SRC_IDX, DST_IDX, ITEM, ITEM * LAYERS)
    for plan in (lf, pf):
        for layer in range(LAYERS):
            assert plan.addresses(layer) == triton_ops.addresses(plan.at(layer))


def test_a_planner_plans_many_batches_checking_only_their_indices(monkeypatch) -> None:
    """Buffers validated once; each plan is the op for its own indices, and bad indices raise
    naming the argument before anything is copied."""
    calls: list[str] = []
    original = K.validate.check_layer_buffers
    monkeypatch.setattr(
        K.validate, "check_layer_buffers", lambda name, *a: calls.append(name) or original(name, *a)
    )
    src = [{"src": rand(ITEMS, 1, 8, seed=layer)} for layer in range(LAYERS)]
    dst = [{"dst": layer.view(ITEMS, 1, 8)} for layer in poisoned_layers()]
    kernel = layer_plan.per_layer_planner(src, dst, 16)
    direct = direct_plan.direct_planner([[t["src"]] for t in src], [[t["dst"]] for t in dst], 1)
    checked = len(calls)
    for planner in (kernel, direct):
        with pytest.raises(IndexError, match="src_indices"):
            planner.plan(SRC_IDX + ITEMS, DST_IDX)
        with pytest.raises(TypeError, match="dst_indices"):
            planner.plan(SRC_IDX, DST_IDX.int())
    assert all((t["dst"].view(torch.uint8) == POISON).all() for t in dst)
    for planner, idx in ((kernel, SRC_IDX), (direct, SRC_IDX.flip(0)), (kernel, DST_IDX)):
        plan = planner.plan(idx, DST_IDX)
        for layer in range(LAYERS):
            plan.run(layer)
            got, want = dst[layer]["dst"][DST_IDX], src[layer]["src"][idx]
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert len(calls) == checked


@pytest.mark.skipif(not env.ENV.triton_interpret, reason="the fakes need TRITON_INTERPRET=1")
def test_a_launch_hook_keeps_triton_runner_on_every_layer(monkeypatch) -> None:
    """With a launch hook set (a profiler), later layers go through Triton's runner, which
    calls the hooks, rather than straight to the launcher."""
    calls: list = []
    monkeypatch.setattr(triton_ops, "transfer_kernel", FakeJit(FakeCompiled(calls, False)))
    hooks = triton.knobs.runtime
    if isinstance(hooks.launch_enter_hook, triton.knobs.HookChain):
        chain = triton.knobs.HookChain()
        chain.add(lambda *a: None)
        monkeypatch.setattr(hooks, "launch_enter_hook", chain)
    else:
        monkeypatch.setattr(hooks, "launch_enter_hook", lambda *a: None)
    _run_every_layer()
    assert [kind for kind, _, _ in calls] == ["bind"] + ["runner"] * (LAYERS - 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_plan_launches_on_the_current_stream() -> None:
    """Every layer's launch, the directly called ones too, is queued on the stream current at
    ``run``: behind a long kernel there, not on the default stream."""
    layers, items = 4, 64
    idx = torch.randperm(items)[:32].cuda()
    src, dst, plan = _cuda_plan(layers, items, idx, idx)
    plan.run(0)  # binds; later layers are launched directly
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles
        for layer in range(1, layers):
            plan.run(layer)
    torch.cuda.current_stream().synchronize()  # the default stream only
    if not side.query():  # the sleep outlasted the check: nothing after it may have run
        assert all(bool((dst[layer][kv].view(torch.uint8) == POISON).all())
                   for layer in range(1, layers) for kv in range(2))  # fmt: skip
    side.synchronize()
    for layer in range(layers):
        for kv in range(2):
            got = dst[layer][kv].view(torch.uint8)
            assert torch.equal(got[idx], src[layer][kv][idx].view(torch.uint8))
