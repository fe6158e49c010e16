from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.radix import RadixKey
from hicache.radix.key import TOKEN_DTYPE, as_radix_key, as_token_array, common_prefix_len


@pytest.mark.parametrize(
    "ids",
    [
        [1, 2, 3],
        (1, 2, 3),
        np.array([1, 2, 3], np.uint16),
        np.array([1, 2, 3]),
        torch.tensor([1, 2, 3]),
        torch.tensor([1, 2, 3], dtype=torch.int32),
    ],
)
def test_accepts_integer_sequences_and_arrays(ids):
    key = RadixKey(ids)
    assert key.token_ids.dtype == TOKEN_DTYPE
    assert key.token_ids.tolist() == [1, 2, 3]
    assert len(key) == 3 and key.extra_key is None


def test_copies_and_is_read_only():
    src = np.array([5, 6, 7])
    key = RadixKey(src)
    src[0] = 99
    assert key.token_ids[0] == 5
    with pytest.raises(ValueError):
        key.token_ids[0] = 1


def test_empty_key():
    assert len(RadixKey([])) == 0
    assert RadixKey(np.empty(0, np.float64)).token_ids.dtype == TOKEN_DTYPE


@pytest.mark.parametrize(
    "ids",
    [
        [1.5, 2.0],
        [True, False],
        ["a"],
        "abc",
        b"ab",
        np.array([1.0]),
        torch.tensor([1.0]),
        torch.tensor([True]),
        [1, None],
        5,
        {1, 2},
    ],
)
def test_rejects_non_integers(ids):
    with pytest.raises(TypeError):
        RadixKey(ids)


@pytest.mark.parametrize("ids", [[-1, 2], np.array([3, -4]), [2**31], np.array([2**40])])
def test_rejects_out_of_range(ids):
    with pytest.raises(ValueError):
        RadixKey(ids)


def test_rejects_2d():
    with pytest.raises(ValueError):
        RadixKey(np.ones((2, 2), np.int64))


def test_extra_key_must_be_hashable():
    with pytest.raises(TypeError, match="extra_key"):
        RadixKey([1], extra_key=["not", "hashable"])
    assert RadixKey([1], extra_key=("lora", 3)).extra_key == ("lora", 3)


def test_slicing_keeps_namespace_and_views():
    key = RadixKey([1, 2, 3, 4], "ns")
    part = key[1:3]
    assert part.token_ids.tolist() == [2, 3] and part.extra_key == "ns"
    assert np.shares_memory(part.token_ids, key.token_ids)
    assert key[0] == RadixKey([1], "ns") and key[-1] == RadixKey([4], "ns")  # as in SGLang
    assert list(key) == [1, 2, 3, 4] and all(type(t) is int for t in key)
    with pytest.raises(TypeError):
        key["0"]
    with pytest.raises(IndexError):
        key[4]
    with pytest.raises(IndexError):
        key[-5]


def test_equality_and_repr():
    assert RadixKey([1, 2], "a") == RadixKey((1, 2), "a")
    assert RadixKey([1, 2], "a") != RadixKey([1, 2], "b")
    assert RadixKey([1, 2]) != RadixKey([1, 3])
    assert "extra_key='a'" in repr(RadixKey(range(20), "a"))


def test_as_radix_key_and_token_array():
    key = RadixKey([1])
    assert as_radix_key(key) is key
    assert as_radix_key([1, 2]).token_ids.tolist() == [1, 2]
    assert as_token_array(key) is key.token_ids


@pytest.mark.parametrize("page", [1, 2, 4])
@pytest.mark.parametrize("n", [8, 8192])
def test_common_prefix_len_rounds_down_to_pages(page, n):
    a = np.arange(n, dtype=TOKEN_DTYPE)
    assert common_prefix_len(a, a.copy(), page) == n
    for mismatch in (0, 1, 3, n - 1):
        b = a.copy()
        b[mismatch] += 1
        expected = mismatch - mismatch % page
        assert common_prefix_len(a, b, page) == expected
    assert common_prefix_len(a[: n // 2], a, page) == n // 2
