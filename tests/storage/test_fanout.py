"""Fanout: a batch's items over a few threads, results in order."""

from __future__ import annotations

import threading

import pytest

from hicache.backends.fanout import Fanout


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("n", [0, 1, 2, 7])
def test_map_keeps_the_order(threads: int, n: int) -> None:
    fan = Fanout(threads, "t")
    assert fan.map(lambda a, b: a * 10 + b, range(n), range(n)) == [a * 11 for a in range(n)]
    fan.close()


def test_items_run_on_several_threads_and_close_stops_them() -> None:
    fan = Fanout(2, "hicache-test-fan")
    barrier = threading.Barrier(2, timeout=10)  # passes only if two items run at once
    names = fan.map(lambda _: (barrier.wait(), threading.current_thread().name)[1], range(2))
    assert len(set(names)) == 2 and all(n.startswith("hicache-test-fan") for n in names)
    fan.close()
    fan.close()
    assert fan.map(lambda x: x + 1, [1, 2]) == [2, 3]  # starts again
    fan.close()


@pytest.mark.parametrize(("threads", "error"), [(0, ValueError), ("2", TypeError)])
def test_bad_threads_raise(threads: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="threads"):
        Fanout(threads, "t")  # type: ignore[arg-type]
