"""The copy-engine path on CUDA: batched copies byte-exact on random data, and the direct ops
using it for pinned (registered) host memory; skipped without CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hicache.kernels as K
from hicache.devices import pin_tensor, unpin_tensor
from hicache.kernels import copy_engine
from tests.kernels.cases import POISON, poisoned, random_bytes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CHUNK = 4096


@pytest.fixture
def pinned_copy():
    """``pinned_copy(t)``: a cudaHostRegister-pinned copy of ``t`` (as the host pools pin),
    unregistered after the test."""
    made: list[torch.Tensor] = []

    def pin(t: torch.Tensor) -> torch.Tensor:
        copy = t.clone()
        assert pin_tensor(copy)
        made.append(copy)
        return copy

    yield pin
    torch.cuda.synchronize()
    for t in made:
        unpin_tensor(t)


@pytest.mark.parametrize("side_stream", [True, False], ids=["batch", "default-stream"])
@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d"])
def test_copy_batch_moves_exactly_the_planned_bytes(direction, side_stream, pinned_copy):
    gen = torch.Generator().manual_seed(5)
    chunks = 64
    src = random_bytes((2 * chunks, CHUNK), torch.uint8, gen)
    dst = poisoned((2 * chunks, CHUNK), torch.uint8)
    src = src.cuda() if direction in ("d2h", "d2d") else pinned_copy(src)
    dst = dst.cuda() if direction in ("h2d", "d2d") else pinned_copy(dst)
    rows_src = torch.randperm(2 * chunks, generator=gen)[:chunks]
    rows_dst = torch.randperm(2 * chunks, generator=gen)[:chunks]
    sizes = torch.randint(1, CHUNK // 8 + 1, (chunks,), generator=gen) * 8  # partial rows too
    stream = torch.cuda.Stream() if side_stream else torch.cuda.default_stream()
    with torch.cuda.stream(stream):
        copy_engine.copy_batch(
            dst.data_ptr() + rows_dst.numpy() * CHUNK,
            src.data_ptr() + rows_src.numpy() * CHUNK,
            sizes.numpy(),
            torch.device("cuda"),
        )
    stream.synchronize()
    want = poisoned((2 * chunks, CHUNK), torch.uint8)
    src_cpu = src.cpu()
    for r_s, r_d, n in zip(rows_src.tolist(), rows_dst.tolist(), sizes.tolist(), strict=True):
        want[r_d, :n] = src_cpu[r_s, :n]
    assert torch.equal(dst.cpu(), want)


def test_copy_batch_accepts_an_empty_batch():
    empty = np.zeros(0, dtype=np.uint64)
    copy_engine.copy_batch(empty, empty, empty, torch.device("cuda"))


@pytest.mark.parametrize("pinned", [True, False])
@pytest.mark.parametrize("page_first_direct", [False, True])
def test_direct_ops_use_the_engine_for_pinned_host_memory(
    monkeypatch, page_first_direct, pinned, pinned_copy
):
    calls = []
    real = copy_engine.copy_batch
    monkeypatch.setattr(copy_engine, "copy_batch", lambda *a: calls.append(len(a[0])) or real(*a))
    gen = torch.Generator().manual_seed(7)
    page, layers, pages = 16, 3, 8
    place = pinned_copy if pinned else torch.Tensor.clone
    host_idx = (
        torch.randperm(pages, generator=gen)[:4, None] * page + torch.arange(page)
    ).flatten()
    dev_idx = torch.randperm(pages * page, generator=gen)[: 4 * page]  # scattered slots
    dev = [random_bytes((pages * page, 2, 64), torch.bfloat16, gen).cuda() for _ in range(2)]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        if page_first_direct:
            host = [place(poisoned((pages, layers, page, 2, 64), torch.bfloat16)) for _ in range(2)]
            layer_list = [t for t in dev for _ in range(layers)]  # every layer = the same tensor
            K.transfer_kv_all_layer_direct_lf_pf(layer_list, host, dev_idx, host_idx, page)
            stream.synchronize()
            got = [h[host_idx // page, :, host_idx % page] for h in host]
            want = [d.cpu()[dev_idx][:, None].expand(-1, layers, -1, -1) for d in dev]
        else:
            host = [place(poisoned((pages * page, 2, 64), torch.bfloat16)) for _ in range(2)]
            K.transfer_kv_direct(dev, host, dev_idx, host_idx, page)
            stream.synchronize()
            got = [h[host_idx] for h in host]
            want = [d.cpu()[dev_idx] for d in dev]
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.view(torch.uint8), w.contiguous().view(torch.uint8))
    untouched = torch.ones(pages, dtype=torch.bool)
    untouched[host_idx // page] = False
    by_page = host[0].view(pages, -1)  # both host layouts: one row per page
    assert bool((by_page[untouched].view(torch.uint8) == POISON).all())
    assert len(calls) == (1 if pinned else 0)
