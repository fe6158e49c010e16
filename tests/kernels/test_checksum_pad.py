"""Page checksums into a column block of a wider store (strided rows), and ``skip_pad``: a page
holding slot 0 records ``NO_SUM`` and is never reported; both backends (the Triton kernel under
the interpreter on CPU, on CUDA on a GPU). Data is random bytes, never zeros."""

from __future__ import annotations

import pytest
import torch

from hicache.kernels.checksum import (
    NO_SUM,
    page_checksums,
    record_page_checksums,
    verify_page_checksums,
)
from tests.kernels.test_checksum import CUDA, INTERPRET, POISON, make_layers

BACKENDS = [
    pytest.param("reference", "cpu", id="reference"),
    pytest.param("triton", "cpu", id="interpreter", marks=INTERPRET),
    pytest.param(
        "triton",
        "cuda",
        id="cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA device")],
    ),
]


@pytest.mark.parametrize(("backend", "device"), BACKENDS)
def test_a_column_block_with_skip_pad_records_and_verifies_only_live_pages(backend, device):
    layers = make_layers(2, 2, 16, (2, 4), torch.float16, seed=3, device=device)
    idx = torch.tensor([5, 9, 0, 7, 11, 12], device=device)  # page 1 holds pad slot 0
    table = torch.full((6, 5), POISON, dtype=torch.int64)
    table = table.pin_memory() if device == "cuda" else table
    block, rows = table[:, 1:3], torch.tensor([4, 0, 2])
    kw = {"backend": backend, "skip_pad": True}
    record_page_checksums(layers, idx, 2, block, rows, **kw)
    if device == "cuda":
        torch.cuda.synchronize()
    want = page_checksums([[t.cpu() for t in p] for p in layers], idx.cpu(), 2)
    assert torch.equal(table[rows[[0, 2]], 1:3], want[[0, 2]])
    assert table[rows[1], 1:3].tolist() == [NO_SUM] * 2
    untouched = torch.ones_like(table, dtype=torch.bool)
    untouched[rows, 1:3] = False
    assert bool((table[untouched] == POISON).all()), "written outside the block's rows"
    layers[0][1][0].view(torch.uint8).view(-1)[0] ^= 0x40  # the pad slot: no page's bytes
    assert verify_page_checksums(layers, idx, 2, block, rows, **kw).tolist() == [3, 0]
    layers[1][0][idx[5]].view(torch.uint8).view(-1)[2] ^= 0x01  # page 2, a live page
    assert verify_page_checksums(layers, idx, 2, block, rows, **kw).tolist() == [2, 1]
    plain = verify_page_checksums(layers, idx, 2, block, rows, backend=backend)
    assert plain.tolist() == [1, 2]  # without skip_pad the padded page differs too
