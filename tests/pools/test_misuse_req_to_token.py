"""Issue 12, ReqToTokenPool.write: no silent conversion of slot ids or indices.

Floats were truncated, ``2**40`` wrapped to 0 (the padding slot) in the int32 table, bools
became 0/1, a negative column counted from the end and ``True`` as an index wrote every row.
Each is now rejected, naming ``values`` or ``indices``, with the table unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.pools import ReqToTokenPool


@pytest.fixture
def pool() -> ReqToTokenPool:
    pool = ReqToTokenPool(4, 8, "cpu")
    rows = pool.alloc(2)
    assert rows == [0, 1]
    pool.write((0, slice(0, 4)), torch.tensor([5, 6, 7, 8]))
    return pool


BAD_VALUES = [
    (torch.tensor([1.7, 2.2]), TypeError),
    (torch.tensor([True, False]), TypeError),
    (torch.tensor([2**40, 3]), ValueError),
    (torch.tensor([2**31, 3]), ValueError),
    (torch.tensor([-1, 3]), ValueError),
    (torch.tensor([1, 2, 3]), ValueError),  # three values for two entries
    (torch.tensor([[1, 2]]), ValueError),
    (torch.tensor([1]), ValueError),  # no broadcasting of a tensor
    (torch.tensor([1, 2], dtype=torch.uint64), TypeError),  # was torch's NotImplementedError
    (torch.zeros(2, dtype=torch.int64, device="meta"), ValueError),
    ([1, 2], TypeError),
    (np.array([1, 2]), TypeError),
    (1.5, TypeError),
    (True, TypeError),
    (2**40, ValueError),
    (-3, ValueError),
]


@pytest.mark.parametrize("values, exc", BAD_VALUES, ids=[repr(v) for v, _ in BAD_VALUES])
@pytest.mark.parametrize("cols", [slice(1, 3), torch.tensor([1, 2])], ids=["slice", "tensor"])
def test_bad_values_are_rejected_before_writing(pool, values, exc, cols):
    before = pool.req_to_token.clone()
    with pytest.raises(exc, match="values"):
        pool.write((0, cols), values)
    assert torch.equal(pool.req_to_token, before)
    pool.write((0, cols), torch.tensor([9, 10]))
    assert pool.req_to_token[0, 1:3].tolist() == [9, 10]


BAD_INDICES = [
    (True, TypeError),
    ((0, True), TypeError),
    (1.0, TypeError),
    ((0, 1.0), TypeError),
    ((0, torch.tensor([1.0])), TypeError),
    ((0, torch.tensor([True, False] * 4)), TypeError),
    ((0, torch.tensor([[1]])), TypeError),
    ((0, 1, 2), TypeError),
    ("0", TypeError),
    (None, TypeError),
    (4, IndexError),
    (-1, IndexError),
    ((0, -1), IndexError),
    ((0, 8), IndexError),
    ((0, torch.tensor([1, 8])), IndexError),
    ((0, torch.tensor([-1])), IndexError),
    ((0, torch.zeros(2, dtype=torch.int64, device="meta")), ValueError),
]


@pytest.mark.parametrize("indices, exc", BAD_INDICES, ids=[repr(i) for i, _ in BAD_INDICES])
def test_bad_indices_are_rejected_before_writing(pool, indices, exc):
    before = pool.req_to_token.clone()
    with pytest.raises(exc, match="indices"):
        pool.write(indices, 3)
    assert torch.equal(pool.req_to_token, before)


def test_accepted_forms(pool):
    pool.write(1, 4)  # a whole row from an int
    assert pool.req_to_token[1].tolist() == [4] * 8
    pool.write((1, 2), torch.tensor(11))
    pool.write((np.int64(1), torch.tensor(3)), 12)
    pool.write((1, torch.tensor([4, 5], dtype=torch.int32)), torch.tensor([2**31 - 1, 0]))
    pool.write((1, slice(6, None)), torch.tensor([13, 14], dtype=torch.int32))
    pool.write((1, slice(0, 0)), torch.tensor([], dtype=torch.int64))
    assert pool.req_to_token[1].tolist() == [4, 4, 11, 12, 2**31 - 1, 0, 13, 14]


@pytest.mark.parametrize(
    ("need", "exc"),
    [(-1, ValueError), (True, TypeError), (1.0, TypeError), (np.int64(1), TypeError)],
)
def test_a_bad_row_count_is_refused_rows_unchanged(pool, need, exc):
    free = pool.available_size()
    with pytest.raises(exc, match="need_size"):
        pool.alloc(need)
    assert pool.available_size() == free and pool.alloc(0) == []
