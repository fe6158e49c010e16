"""``ownership.check_pages``: the page-layout rule on slot arrays of every shape (whole pages,
a trailing partial page, a tail alone), accepted and refused."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hicache.radix.ownership import check_pages

ALLOCATOR = SimpleNamespace(size=64, page_size=4)  # usable slots [4, 68)

GOOD = {
    "one page": [4, 5, 6, 7],
    "pages out of order": [12, 13, 14, 15, 4, 5, 6, 7],
    "partial last page": [8, 9, 10, 11, 20, 21],
    "a tail alone": [16, 17, 18],
    "last usable page": [64, 65, 66, 67],
}
BAD = {
    "misaligned page": ([5, 6, 7, 8], "whole aligned pages"),
    "slots swapped in a page": ([4, 6, 5, 7], "whole aligned pages"),
    "page from two pages": ([4, 5, 6, 7, 8, 9, 10, 15], "whole aligned pages"),
    "misaligned tail": ([4, 5, 6, 7, 13, 14], "whole aligned pages"),
    "gap in the tail": ([12, 14], "whole aligned pages"),
    "repeated page": ([4, 5, 6, 7, 4, 5, 6, 7], "more than once"),
    "reserved page": ([0, 1, 2, 3], "reserved"),
    "past the end": ([68, 69, 70, 71], r"\[4, 68\)"),
}


@pytest.mark.parametrize("slots", GOOD.values(), ids=GOOD.keys())
def test_whole_aligned_pages_pass(slots: list[int]) -> None:
    check_pages(np.array(slots, dtype=np.int64), "slots", ALLOCATOR)


@pytest.mark.parametrize(("slots", "message"), BAD.values(), ids=BAD.keys())
def test_bad_layouts_are_refused(slots: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_pages(np.array(slots, dtype=np.int64), "slots", ALLOCATOR)
