"""``host_order``: a batch's host slots in page order, by sorting only the pages' first slots."""

from __future__ import annotations

import pytest
import torch

from hicache.controller.transfer_indices import host_order


def _pages(starts: list[int], page: int) -> torch.Tensor:
    return (torch.tensor(starts)[:, None] * page + torch.arange(page)).flatten()


@pytest.mark.parametrize("page", [1, 4, 64])
def test_scattered_pages_come_back_in_host_order_with_their_permutation(page) -> None:
    gen = torch.Generator().manual_seed(page)
    starts = torch.randperm(500, generator=gen)[:37].tolist()
    host = _pages(starts, page)
    device = torch.randperm(10_000, generator=gen)[: host.numel()]
    ordered, order = host_order(host, page)
    assert order is not None
    assert torch.equal(ordered, torch.sort(host).values)
    assert torch.equal(torch.sort(order).values, torch.arange(host.numel()))  # a permutation
    assert torch.equal(host[order], ordered)
    pairs = {(int(h), int(d)) for h, d in zip(host, device, strict=True)}
    assert {(int(h), int(d)) for h, d in zip(ordered, device[order], strict=True)} == pairs


@pytest.mark.parametrize("page", [1, 16])
def test_pages_already_in_order_are_left_as_they_are(page) -> None:
    host = _pages([2, 3, 7, 40], page)
    ordered, order = host_order(host, page)
    assert order is None and ordered is host


def test_a_page_moves_whole_with_its_slots_in_the_given_order() -> None:
    host = torch.tensor([8, 9, 10, 11, 0, 1, 2, 3])
    ordered, order = host_order(host, 4)
    assert ordered.tolist() == [0, 1, 2, 3, 8, 9, 10, 11]
    assert order is not None and order.tolist() == [4, 5, 6, 7, 0, 1, 2, 3]
