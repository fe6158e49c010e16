"""A ``LayerPlanner`` runs the op's buffer checks once, at construction: each ``plan`` then
checks only its indices, with the op's own errors (``plans.check_plan_indices``)."""

from __future__ import annotations

import pytest
import torch

import hicache.kernels as K
from hicache.kernels import layer_plan, plans

ITEMS, LAYERS = 16, 2


def planner() -> layer_plan.LayerPlanner:
    src = [{"src": torch.zeros(ITEMS, 1, 4)} for _ in range(LAYERS)]
    dst = [{"dst": torch.zeros(ITEMS, 1, 4)} for _ in range(LAYERS)]
    return layer_plan.per_layer_planner(src, dst, 16)


def test_buffers_are_checked_at_construction_only(monkeypatch) -> None:
    calls: list[str] = []
    original = K.validate.check_data
    monkeypatch.setattr(
        K.validate, "check_data", lambda n, *a: calls.append("data") or original(n, *a)
    )
    made = planner()
    built = len(calls)
    assert built == 2  # the template layer's source and destination
    for n in (1, 3, 5):
        idx = torch.arange(n)
        plan = made.plan(idx, idx.flip(0))
        assert torch.equal(plan.template.src_indices, idx)
        assert torch.equal(plan.template.dst_indices, idx.flip(0))
    assert len(calls) == built


@pytest.mark.parametrize(
    ("src", "dst", "error", "match"),
    [
        ([0, 1], [0, 1], TypeError, "src_indices"),  # not a tensor
        (torch.tensor([0, 1]), torch.tensor([0]), ValueError, "differ in length"),
        (torch.tensor([0, ITEMS]), torch.tensor([0, 1]), IndexError, "src_indices"),
        (torch.tensor([0, 1]), torch.tensor([-1, 1]), IndexError, "dst_indices"),
    ],
)
def test_plan_raises_the_ops_index_errors(src, dst, error, match) -> None:
    made = planner()
    with pytest.raises(error, match=match):
        made.plan(src, dst)
    with pytest.raises(error, match=match):  # the op's own check, for comparison
        plans.per_layer(
            {"src": torch.zeros(ITEMS, 1, 4)}, {"dst": torch.zeros(ITEMS, 1, 4)}, src, dst, 16
        )
