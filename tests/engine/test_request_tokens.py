from __future__ import annotations

import numpy as np
import pytest

from hicache.engine.request import Request
from hicache.radix import RadixKey


def test_tokens_hold_the_prompt_then_each_generated_token():
    req = Request(0, [5, 6, 7], max_new_tokens=4)
    assert req.tokens.ids().tolist() == [5, 6, 7]
    req.output_ids.append(8)
    req.output_ids.append(9)
    assert req.tokens.ids().tolist() == [5, 6, 7, 8, 9]
    assert req.tokens.ids().tolist() == req.origin_input_ids + req.output_ids


def test_the_buffer_is_reserved_once_and_keys_view_it():
    req = Request(0, list(range(10, 20)), max_new_tokens=5)
    first = req.tokens.ids()
    req.output_ids.extend([1, 2, 3, 4, 5])
    key = RadixKey.from_validated(req.tokens.ids(12), "ns")
    assert np.shares_memory(first, req.tokens.ids()) and np.shares_memory(first, key.token_ids)
    assert key.token_ids.tolist() == list(range(10, 20)) + [1, 2]


def test_a_bad_prompt_is_refused_at_construction():
    with pytest.raises(TypeError, match="token_ids"):
        Request(0, [1, 2.0], max_new_tokens=1)


def test_a_replaced_output_list_is_converted_anew():
    req = Request(0, [1, 2], max_new_tokens=3)
    req.output_ids.append(3)
    assert req.tokens.ids().tolist() == [1, 2, 3]
    req.output_ids = [9]
    assert req.tokens.ids().tolist() == [1, 2, 9]
