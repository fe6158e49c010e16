"""The C path for lists (``hicache.radix.cpack``) against the pure-Python one."""

from __future__ import annotations

import enum

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.radix import tokens
from hicache.radix.tokens import TOKEN_DTYPE, to_token_array

cpack = pytest.importorskip("hicache.radix.cpack") if tokens.NATIVE_PACK else None


class Color(enum.IntEnum):
    RED = 7


GOOD = st.integers(0, 2**31 - 1) | st.sampled_from([0, 1, 2**30 - 1, 2**30, 2**31 - 1])
ANY_ITEM = GOOD | st.sampled_from(
    [-1, -(2**40), 2**31, 2**64, True, False, 1.0, "1", None, np.int64(5), Color.RED, [1]]
)


def _outcome(ids: list | tuple, native: bool) -> tuple[str, list | None]:
    try:
        arr = to_token_array(ids, native=native)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, None
    assert arr.dtype == TOKEN_DTYPE and not arr.flags.writeable
    return "ok", arr.tolist()


@settings(max_examples=300, deadline=None)
@given(st.lists(GOOD, max_size=64) | st.lists(ANY_ITEM, max_size=64))
def test_c_and_python_paths_agree_on_results_and_errors(ids):
    for seq in (ids, tuple(ids)):
        assert _outcome(seq, native=True) == _outcome(seq, native=False)


@pytest.mark.skipif(not tokens.NATIVE_PACK, reason="cpack not built")
def test_pack_ids_stops_at_the_first_item_it_does_not_take():
    out = np.full(6, -7, dtype=np.int32)  # poisoned: unwritten slots show
    assert cpack.pack_ids([3, 2**31 - 1, 0, True, 4, 5], out) == 3
    assert out.tolist() == [3, 2**31 - 1, 0, -7, -7, -7]
    for bad in (-1, 2**31, 1.0, np.int32(1), Color.RED):
        assert cpack.pack_ids([1, bad], out) == 1
    assert cpack.pack_ids((), out) == 0


@pytest.mark.skipif(not tokens.NATIVE_PACK, reason="cpack not built")
def test_pack_ids_refuses_bad_arguments():
    with pytest.raises(TypeError, match="seq must be a list or tuple"):
        cpack.pack_ids(range(3), np.empty(3, np.int32))
    with pytest.raises(ValueError, match="out holds 8 bytes, 12 needed"):
        cpack.pack_ids([1, 2, 3], np.empty(2, np.int32))
    read_only = np.empty(3, np.int32)
    read_only.flags.writeable = False
    with pytest.raises((TypeError, ValueError, BufferError)):
        cpack.pack_ids([1, 2, 3], read_only)
