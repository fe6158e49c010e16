"""The direct ops against per-slot oracles, and the run merging behind them.

Each op runs both ways: one ``copy_`` per run (the CPU path), and through the batched copy-engine
plan (addresses and byte counts) with a CPU stand-in for the engine that ``memmove``s each copy.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

import hicache.kernels as K
from hicache.kernels import copy_engine, direct
from hicache.kernels.direct import runs
from tests.kernels.cases import POISON, poisoned, random_bytes

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.uint8]
SLOT = (2, 8)  # (heads, head_dim); MLA uses (1, kv_dim)


def paged_indices(
    slots: int, n: int, page: int, gen: torch.Generator, whole_pages: bool = True
) -> torch.Tensor:
    """``n`` slots made of whole random pages, each page's slots in order (else random slots)."""
    if not whole_pages:
        return torch.randperm(slots, generator=gen)[:n]
    pages = torch.randperm(slots // page, generator=gen)[: n // page]
    return (pages[:, None] * page + torch.arange(page)).flatten()


@pytest.fixture(params=["copy_", "engine"])
def batches(request, monkeypatch) -> list[int] | None:
    """None for the copy_ path; for the engine plan, the sizes of the batches it was handed."""
    if request.param == "copy_":
        return None
    sizes: list[int] = []
    spans: list[tuple[int, int]] = []  # [start, end) of every tensor of the op

    def engine_device(pairs):
        spans[:] = [
            (t.data_ptr(), t.data_ptr() + t.nbytes)
            for pair in pairs
            for t in (pair[0].tensor, pair[1].tensor)
        ]
        return pairs[0][0].tensor.device

    def memmove_batch(dst, src, nbytes, device):
        assert device == torch.device("cpu")
        sizes.append(len(dst))
        for d, s, n in zip(dst.tolist(), src.tolist(), nbytes.tolist(), strict=True):
            for addr in (d, s):  # never let a wrong plan touch memory outside the tensors
                assert any(lo <= addr and addr + n <= hi for lo, hi in spans), "copy out of bounds"
            ctypes.memmove(d, s, n)

    monkeypatch.setattr(direct, "engine_device", engine_device)
    monkeypatch.setattr(copy_engine, "copy_batch", memmove_batch)
    return sizes


def assert_one_batch(batches: list[int] | None, runs_per_tensor: int, tensors: int) -> None:
    if batches is not None:
        assert batches == [runs_per_tensor * tensors]


def as_bytes(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.view(torch.uint8).clone() for t in tensors]


def test_runs_merge_consecutive_slots_on_both_sides():
    src = torch.tensor([4, 5, 6, 7, 0, 1, 9, 10])
    dst = torch.tensor([8, 9, 10, 11, 12, 13, 2, 4])
    assert runs(src, dst) == [(4, 8, 4), (0, 12, 2), (9, 2, 1), (10, 4, 1)]


def test_runs_split_at_page_boundaries_of_a_paged_side():
    src, dst = torch.arange(2, 10), torch.arange(20, 28)
    assert runs(src, dst) == [(2, 20, 8)]
    assert runs(src, dst, src_page=4) == [(2, 20, 2), (4, 22, 4), (8, 26, 2)]
    assert runs(src, dst, dst_page=8) == [(2, 20, 4), (6, 24, 4)]
    assert runs(torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)) == []


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_transfer_kv_direct(dtype, page_size, batches):
    gen = torch.Generator().manual_seed(page_size)
    slots, n = 4 * 64, 2 * 64
    src = [random_bytes((slots, *SLOT), dtype, gen) for _ in range(3)]
    dst = [poisoned((slots, *SLOT), dtype) for _ in range(3)]
    src_idx, dst_idx = (paged_indices(slots, n, page_size, gen) for _ in range(2))
    want = as_bytes(dst)
    for s_buf, w in zip(src, want, strict=True):
        w[dst_idx] = s_buf.view(torch.uint8)[src_idx]
    K.transfer_kv_direct(src, dst, src_idx, dst_idx, page_size)
    assert all(torch.equal(a, b) for a, b in zip(as_bytes(dst), want, strict=True))
    assert_one_batch(batches, len(runs(src_idx, dst_idx)), len(src))


@pytest.mark.parametrize("whole_pages", [True, False], ids=["pages", "slots"])
@pytest.mark.parametrize("mla", [False, True])
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_per_layer_direct_pf_lf(dtype, page_size, mla, whole_pages, batches):
    gen = torch.Generator().manual_seed(page_size + mla)
    slot, kinds, layers, layer_id = ((1, 24) if mla else SLOT), (1 if mla else 2), 3, 1
    host = [random_bytes((4, layers, page_size, *slot), dtype, gen) for _ in range(kinds)]
    dev = [poisoned((3 * page_size, *slot), dtype) for _ in range(kinds)]
    src_idx = paged_indices(4 * page_size, 2 * page_size, page_size, gen, whole_pages)
    dst_idx = paged_indices(3 * page_size, 2 * page_size, page_size, gen, whole_pages)
    want = as_bytes(dev)
    for h, w in zip(host, want, strict=True):
        for s, d in zip(src_idx.tolist(), dst_idx.tolist(), strict=True):
            w[d] = h[s // page_size, layer_id, s % page_size].view(torch.uint8)
    K.transfer_kv_per_layer_direct_pf_lf(host, dev, src_idx, dst_idx, layer_id, page_size)
    assert all(torch.equal(a, b) for a, b in zip(as_bytes(dev), want, strict=True))
    assert_one_batch(batches, len(runs(src_idx, dst_idx, src_page=page_size)), kinds)


@pytest.mark.parametrize("whole_pages", [True, False], ids=["pages", "slots"])
@pytest.mark.parametrize("mla", [False, True])
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_layer_direct_lf_pf(dtype, page_size, mla, whole_pages, batches):
    gen = torch.Generator().manual_seed(page_size * 3 + mla)
    slot, kinds, layers = ((1, 24) if mla else SLOT), (1 if mla else 2), 3
    dev = [random_bytes((3 * page_size, *slot), dtype, gen) for _ in range(kinds * layers)]
    host = [poisoned((4, layers, page_size, *slot), dtype) for _ in range(kinds)]
    src_idx = paged_indices(3 * page_size, 2 * page_size, page_size, gen, whole_pages)
    dst_idx = paged_indices(4 * page_size, 2 * page_size, page_size, gen, whole_pages)
    want = as_bytes(host)
    for k, layer_buf in enumerate(dev):
        w = want[k // layers]
        for s, d in zip(src_idx.tolist(), dst_idx.tolist(), strict=True):
            w[d // page_size, k % layers, d % page_size] = layer_buf[s].view(torch.uint8)
    K.transfer_kv_all_layer_direct_lf_pf(dev, host, src_idx, dst_idx, page_size)
    assert all(torch.equal(a, b) for a, b in zip(as_bytes(host), want, strict=True))
    assert_one_batch(batches, len(runs(src_idx, dst_idx, dst_page=page_size)), kinds * layers)
    if whole_pages:
        free_page = next(p for p in range(4) if p * page_size not in dst_idx.tolist())
        assert bool((host[0][free_page].view(torch.uint8) == POISON).all())


def test_direct_copies_once_per_run(monkeypatch):
    """Two runs of whole pages: one copy_ per run and tensor."""
    calls = []
    original = torch.Tensor.copy_
    monkeypatch.setattr(
        torch.Tensor, "copy_", lambda self, src, **kw: calls.append(1) or original(self, src, **kw)
    )
    src = [torch.ones(64, 4), torch.ones(64, 4)]
    dst = [torch.zeros(64, 4), torch.zeros(64, 4)]
    src_idx = torch.cat([torch.arange(0, 32), torch.arange(48, 64)])
    dst_idx = torch.cat([torch.arange(16, 48), torch.arange(0, 16)])
    K.transfer_kv_direct(src, dst, src_idx, dst_idx, 16)
    assert len(calls) == 2 * 2


def test_engine_is_unavailable_without_a_cuda_runtime(monkeypatch):
    """ROCm builds, CPU builds and a CUDA build whose runtime library will not load all fall back
    to copy_ (the direct ops then never call the engine)."""

    def no_runtime():
        raise RuntimeError("the CUDA runtime library was not found")

    monkeypatch.setattr(copy_engine, "open_cudart", no_runtime)
    try:
        for cuda, hip, loads in (("13.0", None, 1), (None, None, 0), ("13.0", "6.2", 0)):
            monkeypatch.setattr(torch.version, "cuda", cuda)
            monkeypatch.setattr(torch.version, "hip", hip)
            copy_engine.clear_caches()
            assert copy_engine.available() is False
            assert copy_engine.runtime_load_attempts() == loads
    finally:  # later tests (on a GPU machine) must see the real runtime again
        copy_engine.clear_caches()


@pytest.mark.parametrize("page_size", [1, 4])
def test_plans_on_the_engine_copy_every_layer(monkeypatch, page_size):
    """A direct plan computes every layer's engine addresses at once (layer 0's offsets plus
    each layer's bases): each layer's batch copies that layer's runs and nothing else."""
    from hicache.kernels import direct_plan

    layers, slots, n = 3, 32, 16
    gen = torch.Generator().manual_seed(page_size)
    src_lf = [[random_bytes((slots, *SLOT), torch.float16, gen) for _ in range(2)]
              for _ in range(layers)]  # fmt: skip
    src_pf = [random_bytes((slots // page_size, layers, page_size, *SLOT), torch.float16, gen)
              for _ in range(2)]  # fmt: skip
    tensors = [t for layer in src_lf for t in layer] + src_pf
    dst = {name: [[poisoned((slots, *SLOT), torch.float16) for _ in range(2)]
                  for _ in range(layers)] for name in ("lf", "pf")}  # fmt: skip
    tensors += [t for name in dst for layer in dst[name] for t in layer]
    spans = [(t.data_ptr(), t.data_ptr() + t.nbytes) for t in tensors]
    sizes: list[int] = []

    def memmove_batch(d_addr, s_addr, nbytes, device):
        sizes.append(len(d_addr))
        for d, s, size in zip(d_addr.tolist(), s_addr.tolist(), nbytes.tolist(), strict=True):
            for addr in (d, s):
                assert any(lo <= addr and addr + size <= hi for lo, hi in spans), "out of bounds"
            ctypes.memmove(d, s, size)

    monkeypatch.setattr(direct_plan, "engine_device", lambda pairs: torch.device("cpu"))
    monkeypatch.setattr(copy_engine, "copy_batch", memmove_batch)
    src_idx = paged_indices(slots, n, page_size, gen)
    dst_idx = paged_indices(slots, n, page_size, gen)
    lf = K.plan_direct(src_lf, dst["lf"], src_idx, dst_idx, page_size)
    pf = K.plan_direct_pf_lf(src_pf, dst["pf"], src_idx, dst_idx, page_size)
    for layer in reversed(range(layers)):  # any order: the addresses are per layer
        lf.run(layer)
        pf.run(layer)
    assert len(sizes) == 2 * layers
    for layer in range(layers):
        for kv in range(2):
            want_lf = src_lf[layer][kv][src_idx]
            want_pf = src_pf[kv][src_idx // page_size, layer, src_idx % page_size]
            assert torch.equal(
                dst["lf"][layer][kv][dst_idx].view(torch.uint8), want_lf.view(torch.uint8)
            )
            assert torch.equal(
                dst["pf"][layer][kv][dst_idx].view(torch.uint8), want_pf.view(torch.uint8)
            )
            untouched = torch.ones(slots, dtype=torch.bool)
            untouched[dst_idx] = False
            for name in dst:
                assert bool((dst[name][layer][kv][untouched].view(torch.uint8) == POISON).all())
