"""The shared argument checks: each names the argument and the rule it broke."""

from __future__ import annotations

import pytest
import torch

from hicache.checks import check_choice, check_index_tensor, check_int, check_slot_indices


@pytest.mark.parametrize("value", [True, 1.0, "1", None])
def test_check_int_refuses_non_ints_by_name(value) -> None:
    with pytest.raises(TypeError, match="page_size must be an int"):
        check_int("page_size", value, minimum=1)


def test_check_int_bounds_and_passes_through() -> None:
    assert check_int("n", 0) == 0
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        check_int("n", 0, minimum=1)


def test_check_choice_lists_the_allowed() -> None:
    assert check_choice("io_backend", "direct", ("kernel", "direct")) == "direct"
    with pytest.raises(ValueError, match=r"io_backend must be one of \('kernel', 'direct'\)"):
        check_choice("io_backend", "dma", ("kernel", "direct"))


def test_slot_tensor_checks() -> None:
    ok = torch.tensor([0, 3], dtype=torch.int64)
    assert check_slot_indices("slots", ok, 4) is ok
    with pytest.raises(IndexError, match=r"slots must lie in \[0, 3\)"):
        check_slot_indices("slots", ok, 3)
    with pytest.raises(TypeError, match="slots must be int64"):
        check_index_tensor("slots", ok.int())
    with pytest.raises(ValueError, match="slots must be 1-D"):
        check_index_tensor("slots", ok.view(1, 2))
