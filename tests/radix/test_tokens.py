from __future__ import annotations

import enum

import numpy as np
import pytest
import torch

from hicache.radix import RadixCache, RadixKey
from hicache.radix.key import as_token_array
from hicache.radix.tokens import TOKEN_DTYPE, RequestTokens, TokenBuffer, to_token_array

CHUNK = 16_384  # tokens.py packs long lists in chunks of this many ids


class Color(enum.IntEnum):
    RED = 7


@pytest.mark.parametrize("n", [0, 1, 63, CHUNK, CHUNK + 1, 2 * CHUNK + 5])
def test_list_conversion_matches_numpy(n):
    ids = np.random.default_rng(n).integers(0, 2**31 - 1, n)
    arr = to_token_array(ids.tolist())
    assert arr.dtype == TOKEN_DTYPE and not arr.flags.writeable
    np.testing.assert_array_equal(arr, ids)
    np.testing.assert_array_equal(to_token_array(tuple(ids.tolist())), ids)


def test_integer_scalars_and_int_subclasses_are_ids():
    assert to_token_array([np.int64(3), np.uint16(4), Color.RED, 2**31 - 1]).tolist() == [
        3,
        4,
        7,
        2**31 - 1,
    ]


@pytest.mark.parametrize("at", [0, 5, CHUNK + 3])
@pytest.mark.parametrize(
    "bad, error",
    [
        (1.0, TypeError),
        (True, TypeError),
        (False, TypeError),
        ("1", TypeError),
        (None, TypeError),
        ([1], TypeError),
        (-1, ValueError),
        (2**31, ValueError),
        (2**70, ValueError),
    ],
)
def test_a_bad_id_anywhere_in_a_list_is_refused(at, bad, error):
    ids: list = list(range(2, CHUNK + 10))
    ids[at] = bad
    with pytest.raises(error, match="token_ids"):
        to_token_array(ids)


def test_buffer_views_its_tokens_without_copies():
    buf = TokenBuffer([1, 2, 3])
    buf.append(4)
    buf.extend(np.array([5, 6]))
    assert len(buf) == 6 and buf.ids().tolist() == [1, 2, 3, 4, 5, 6]
    assert buf.ids(2).tolist() == [1, 2] and not buf.ids().flags.writeable
    key = RadixKey(buf, "ns")
    assert np.shares_memory(key.token_ids, buf.ids()) and key.extra_key == "ns"
    assert as_token_array(buf) is not None and np.shares_memory(as_token_array(buf), buf.ids())


def test_views_stay_valid_while_the_buffer_grows():
    buf = TokenBuffer([9, 8], capacity=2)
    early = buf.ids()
    for t in range(100):
        buf.append(t)
    assert early.tolist() == [9, 8]
    assert buf.ids(2).tolist() == [9, 8] and buf.ids()[-1] == 99


def test_capacity_reserves_so_appends_never_move():
    buf = TokenBuffer([1], capacity=10)
    first = buf.ids()
    for t in range(9):
        buf.append(t)
    assert np.shares_memory(first, buf.ids())


@pytest.mark.parametrize(
    "bad, error", [(True, TypeError), (1.0, TypeError), ("3", TypeError), (-1, ValueError)]
)
def test_bad_tokens_leave_the_buffer_unchanged(bad, error):
    buf = TokenBuffer([1, 2])
    with pytest.raises(error, match="token"):
        buf.append(bad)
    with pytest.raises(error, match="token_ids"):
        buf.extend([3, bad])
    assert buf.ids().tolist() == [1, 2]


def test_buffer_accepts_numpy_and_tensor_tokens():
    buf = TokenBuffer(torch.tensor([1, 2]))
    buf.append(np.int64(3))
    assert buf.ids().tolist() == [1, 2, 3]


@pytest.mark.parametrize("end, error", [(3, ValueError), (-1, ValueError), (1.0, TypeError)])
def test_ids_end_must_be_within_the_tokens_held(end, error):
    with pytest.raises(error, match="end"):
        TokenBuffer([1, 2]).ids(end)


@pytest.mark.parametrize("capacity, error", [(-1, ValueError), (2.0, TypeError)])
def test_capacity_must_be_a_non_negative_int(capacity, error):
    with pytest.raises(error, match="capacity"):
        TokenBuffer([1], capacity=capacity)


def test_a_tree_node_viewing_a_buffer_survives_the_buffer_growing():
    cache = RadixCache(None, None, page_size=2)
    buf = TokenBuffer(list(range(10, 18)), capacity=8)
    cache.insert(RadixKey.from_validated(buf.ids(), None))
    buf.extend(list(range(100, 200)))  # moves the buffer; the node keeps the old one
    assert len(cache.match_prefix(RadixKey(list(range(10, 18)))).device_indices) == 8
    cache.check_invariants()


def test_follow_appends_only_the_outputs_not_yet_held():
    prompt, output = [1, 2, 3], [4]
    buf = TokenBuffer(prompt)
    assert buf.follow(len(prompt), output).ids().tolist() == [1, 2, 3, 4]
    output += [5, 6]
    assert buf.follow(len(prompt), output).ids().tolist() == [1, 2, 3, 4, 5, 6]
    assert buf.follow(len(prompt), output).ids().tolist() == [1, 2, 3, 4, 5, 6]


def test_request_tokens_follow_appends_and_replaced_lists():
    prompt, output = [1, 2], [3]
    tracked = RequestTokens(prompt, output, capacity=4)
    first = tracked.get(prompt, output)
    output.append(4)
    assert tracked.get(prompt, output) is first and first.ids().tolist() == [1, 2, 3, 4]
    prompt = [7, 8, 9]
    assert tracked.get(prompt, output).ids().tolist() == [7, 8, 9, 3, 4]
    output = [5]
    assert tracked.get(prompt, output).ids().tolist() == [7, 8, 9, 5]
