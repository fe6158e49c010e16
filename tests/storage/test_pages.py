"""PageIO against the host layouts: which bytes make a page object, and that reads land in
exactly that page."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from hicache.backends.pages import PageIO
from tests.storage.conftest import page_bytes, page_of, page_view, slots


def test_geometry(host: Any) -> None:
    pages = PageIO(host)
    assert pages.parts == (2 if host.parts == 2 else 1) == len(host.host_parts)
    assert pages.object_bytes == host.page_size * host.layer_num * host.item_size
    assert pages.zero_copy == (host.layout != "layer_first")
    assert pages.regions() == [
        (p.data_ptr(), p.numel() * p.element_size()) for p in host.host_parts
    ]


def test_source_is_the_page_in_layout_order(host: Any) -> None:
    pages = PageIO(host)
    for slot in (0, 3 * host.page_size, host.size - host.page_size):
        objs = pages.source(slot)
        assert [o.dtype for o in objs] == [np.uint8] * host.parts
        assert [o.tobytes() for o in objs] == page_bytes(host, slot)
        pool = [part.view(torch.uint8).numpy() for part in host.host_parts]
        shared = [np.shares_memory(o, p) for o, p in zip(objs, pool, strict=True)]
        assert shared == [pages.zero_copy] * host.parts  # views, or copies for layer_first


def test_target_and_commit_write_exactly_one_page(host: Any) -> None:
    pages, slot = PageIO(host), 5 * host.page_size
    rng = np.random.default_rng(0)
    expected = [part.clone() for part in host.host_parts]
    targets = pages.target(slot)
    assert [t.nbytes for t in targets] == [pages.object_bytes] * host.parts
    fresh = [rng.integers(0, 256, pages.object_bytes, np.uint8) for _ in targets]
    for target, data in zip(targets, fresh, strict=True):
        target[:] = data
    if not pages.zero_copy:  # staging arrays: the pool changes only on commit
        assert all(
            torch.equal(a.view(torch.uint8), b.view(torch.uint8))
            for a, b in zip(host.host_parts, expected, strict=True)
        )
    pages.commit(slot, targets)
    for part, data in zip(expected, fresh, strict=True):
        page = page_of(part, host.layout, host.page_size, slot).view(torch.uint8)
        page.copy_(torch.from_numpy(data).view(page.shape))
    for got, want in zip(host.host_parts, expected, strict=True):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_address_points_at_the_page(host: Any) -> None:
    pages = PageIO(host)
    if not pages.zero_copy:
        pytest.skip("layer_first pages are strided: no address")
    slot = 2 * host.page_size
    assert pages.address(slot) == [page_view(host, p, slot).data_ptr() for p in range(host.parts)]


def test_page_slots(host: Any) -> None:
    pages, ps = PageIO(host), host.page_size
    assert pages.page_slots([], slots([])) == []
    assert pages.page_slots(["a", "b"], slots([3, 1])) == [3 * ps, ps]
    strided = torch.stack([slots([1]), slots([2])], 1)[:, 0]  # a view, not contiguous
    assert not strided.is_contiguous() and pages.page_slots(["a"], strided) == [ps]
    with pytest.raises(ValueError, match="host_indices must hold"):
        pages.page_slots(["a"], slots([]))
    with pytest.raises(ValueError, match="whole pages"):
        pages.page_slots(["a"], slots([0]) + 1)
    with pytest.raises(IndexError):
        pages.page_slots(["a"], slots([host.size // ps]))
    with pytest.raises(TypeError):
        pages.page_slots("a", slots([0]))
