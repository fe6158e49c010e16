"""Duration histograms: a duration lands in the first bucket whose bound holds it."""

from __future__ import annotations

import threading

from hicache.durations import BUCKETS_S, EMPTY, DurationHistogram


def test_bounds_are_inclusive_and_the_overflow_is_last() -> None:
    h = DurationHistogram()
    for seconds in (0.0, 0.0001, 0.00011, 0.001, 60.0, 61.0, -1.0):
        h.observe(seconds)
    d = h.snapshot()
    assert d.counts[0] == 3  # 0, the bound itself, and a negative clock step as 0
    assert d.counts[1] == 1 and d.counts[BUCKETS_S.index(0.001)] == 1
    assert d.counts[-2] == 1 and d.counts[-1] == 1  # 60 s in its bucket, 61 s above all
    assert d.count == 7 and abs(d.sum_s - (0.0001 + 0.00011 + 0.001 + 121.0)) < 1e-9
    cumulative = d.cumulative()
    assert cumulative[-1] == (float("inf"), 7) and cumulative[0] == (0.0001, 3)
    assert [n for _, n in cumulative] == sorted(n for _, n in cumulative)


def test_snapshots_are_frozen_and_threads_lose_no_count() -> None:
    h = DurationHistogram()
    before = h.snapshot()
    assert before == EMPTY and before.count == 0

    def work() -> None:
        for _ in range(2000):
            h.observe(0.003)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert before.count == 0 and h.snapshot().count == 8000
    assert h.snapshot().counts[BUCKETS_S.index(0.005)] == 8000
