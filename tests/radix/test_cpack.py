"""The C paths (``hicache.radix.cpack``: lists to ids, the tree's compare helpers) against the
pure-Python / numpy ones."""

from __future__ import annotations

import enum

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.radix import RadixCache, RadixKey, tokens, tree
from hicache.radix.key import numpy_match_len, numpy_page_bytes
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


# ---- the tree's compare helpers: cpack.match_len / page_bytes against the numpy forms ----

native_only = pytest.mark.skipif(not tokens.NATIVE_PACK, reason="cpack not built")


@native_only
@settings(max_examples=300, deadline=None)
@given(st.data())
def test_match_len_and_page_bytes_agree_with_numpy(data):
    page = data.draw(st.sampled_from([1, 2, 4]))
    ids = np.array(data.draw(st.lists(st.integers(0, 3), max_size=40)), dtype=TOKEN_DTYPE)
    stop = data.draw(st.integers(0, len(ids)))
    pos = data.draw(st.integers(0, stop))
    stop -= (stop - pos) % page  # the tree passes a whole-page range
    key = np.array(data.draw(st.lists(st.integers(0, 3), max_size=40)), dtype=TOKEN_DTYPE)
    key = key[: len(key) - len(key) % page]
    assert cpack.match_len(key, ids, pos, stop, page) == numpy_match_len(key, ids, pos, stop, page)
    if stop - pos >= page:
        assert cpack.page_bytes(ids, pos, page) == numpy_page_bytes(ids, pos, page)


@native_only
@pytest.mark.parametrize("at", [0, 1, 1023, 1024, 1025, 4095, 5000, 9999])
@pytest.mark.parametrize("page", [1, 16])
def test_match_len_finds_the_first_difference_across_its_blocks(at, page):
    ids = np.arange(10_000, dtype=TOKEN_DTYPE)
    key = ids[100:].copy()  # compared with ids[100:]
    assert cpack.match_len(key, ids, 100, 10_000, page) == 9900 - 9900 % page
    if at < len(key):
        key[at] += 1
        assert cpack.match_len(key, ids, 100, 10_000, page) == at - at % page
    assert cpack.match_len(key[:0], ids, 5, 5, page) == 0


@native_only
def test_the_helpers_refuse_bad_ranges_and_buffers():
    ids = np.arange(8, dtype=TOKEN_DTYPE)
    for pos, stop, page in ((-1, 4, 1), (5, 4, 1), (0, 9, 1), (0, 4, 0)):
        with pytest.raises(ValueError, match="match_len: need 0 <= pos"):
            cpack.match_len(ids, ids, pos, stop, page)
    for pos, page in ((-1, 1), (7, 2), (0, 0)):
        with pytest.raises(ValueError, match="is not a whole page"):
            cpack.page_bytes(ids, pos, page)
    with pytest.raises(TypeError, match="key must hold 4-byte token ids"):
        cpack.match_len(ids.astype(np.int64), ids, 0, 8, 1)
    with pytest.raises((ValueError, BufferError)):  # numpy refuses a strided view
        cpack.match_len(ids[::2], ids, 0, 4, 1)
    with pytest.raises(TypeError, match="match_len takes 5 arguments"):
        cpack.match_len(ids, ids, 0, 8)


def test_a_stepped_key_slice_is_contiguous_and_matches():
    key = RadixKey(list(range(16)))[::2]
    assert key.token_ids.flags.c_contiguous and not key.token_ids.flags.writeable
    cache = RadixCache(None, None)
    cache.insert(list(range(0, 16, 2)))
    assert cache.match_prefix(key).device_indices.tolist() == list(range(0, 16, 2))


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_tree_walks_alike_with_the_numpy_helpers(monkeypatch, page_size):
    """The fallback without a C compiler: same matches, splits and inserts as the C helpers."""
    rng = np.random.default_rng(page_size)
    seqs = [rng.integers(0, 4, 12 * page_size).tolist() for _ in range(60)]
    results = []
    for helpers in ((tree.match_len, tree.page_bytes), (numpy_match_len, numpy_page_bytes)):
        monkeypatch.setattr(tree, "match_len", helpers[0])
        monkeypatch.setattr(tree, "page_bytes", helpers[1])
        cache = RadixCache(None, None, page_size)
        found = [
            (cache.insert(s[: 8 * page_size]), cache.match_prefix(s).device_prefix_len)
            for s in seqs
        ]
        cache.check_invariants()
        results.append((found, cache.all_values_flatten().tolist()))
    assert results[0] == results[1]
