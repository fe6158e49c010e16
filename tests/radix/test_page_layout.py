"""``ownership.check_pages``: the page-layout rule on slot arrays of every shape (whole pages,
a trailing partial page, a tail alone), accepted and refused, by both of its paths (a Python
loop up to ``ownership.SMALL`` slots, numpy above)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hicache.radix import ownership
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


@pytest.fixture(params=["loop", "numpy"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each case through the Python loop, then through numpy."""
    monkeypatch.setattr(ownership, "SMALL", 10**9 if request.param == "loop" else 0)
    return str(request.param)


@pytest.mark.parametrize("slots", GOOD.values(), ids=GOOD.keys())
def test_whole_aligned_pages_pass(slots: list[int], path: str) -> None:
    check_pages(np.array(slots, dtype=np.int64), "slots", ALLOCATOR)


@pytest.mark.parametrize(("slots", "message"), BAD.values(), ids=BAD.keys())
def test_bad_layouts_are_refused(slots: list[int], message: str, path: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_pages(np.array(slots, dtype=np.int64), "slots", ALLOCATOR)


def verdict(slots: np.ndarray, small: int, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(ownership, "SMALL", small)
    try:
        check_pages(slots, "slots", ALLOCATOR)
    except ValueError as exc:
        return str(exc)
    return "ok"


@pytest.mark.parametrize("seed", range(40))
def test_both_paths_agree_on_random_layouts(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole pages in random order, then one random corruption (or none): the loop and numpy
    give the same verdict and message."""
    rng = np.random.default_rng(seed)
    pages = rng.choice(np.arange(0, 18), size=int(rng.integers(1, 6)), replace=False)
    slots = (pages[:, None] * 4 + np.arange(4)).ravel()[: int(rng.integers(1, 4 * pages.size + 1))]
    if seed % 2:
        slots[int(rng.integers(slots.size))] += int(rng.integers(-5, 6))
    assert verdict(slots, 10**9, monkeypatch) == verdict(slots, 0, monkeypatch)
