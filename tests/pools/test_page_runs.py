"""The free list's runs of consecutive pages (``hicache.pools.page_runs``)."""

from __future__ import annotations

from collections import deque

import numpy as np

from hicache.pools.page_runs import run_lengths, runs_hold, take_run


def test_run_lengths_split_at_every_gap_and_descent() -> None:
    pages = np.array([3, 4, 5, 9, 10, 2, 7], dtype=np.int64)
    assert list(run_lengths(pages)) == [3, 2, 1, 1]
    assert list(run_lengths(np.empty(0, dtype=np.int64))) == []


def test_take_run_says_whether_the_pages_lie_in_the_first_run() -> None:
    runs = deque([3, 2, 4])
    assert take_run(runs, 2) and list(runs) == [1, 2, 4]
    assert take_run(runs, 1) and list(runs) == [2, 4]  # an emptied run is dropped
    assert not take_run(runs, 3) and list(runs) == [3]  # across a boundary
    assert take_run(runs, 0) and list(runs) == [3]


def test_runs_hold_rejects_a_run_that_is_not_consecutive() -> None:
    pages = np.array([1, 2, 3, 8], dtype=np.int64)
    assert runs_hold(pages, deque([3, 1]))
    assert runs_hold(pages, deque([1, 2, 1]))  # a run may be split further
    assert not runs_hold(pages, deque([4]))
    assert not runs_hold(pages, deque([3]))  # lengths must cover the list
    assert not runs_hold(pages, deque([3, 0, 1]))
