"""Fanout: a batch's items over a few threads, results in order."""

from __future__ import annotations

import threading

import pytest

from hicache.backends.fanout import Fanout


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("n", [0, 1, 2, 7])
@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_map_chunks_keeps_the_order(threads: int, n: int, chunk: int) -> None:
    fan = Fanout(threads, "t")
    seen: list[list[int]] = []

    def tens(items: list[int]) -> list[int]:
        seen.append(items)
        return [x * 10 for x in items]

    assert fan.map_chunks(tens, list(range(n)), chunk) == [x * 10 for x in range(n)]
    assert sorted(seen) == [list(range(i, min(n, i + chunk))) for i in range(0, n, chunk)]
    fan.close()


def test_items_run_on_several_threads_and_close_stops_them() -> None:
    fan = Fanout(2, "hicache-test-fan")
    barrier = threading.Barrier(2, timeout=10)  # passes only if two items run at once
    names = fan.map_chunks(
        lambda c: [(barrier.wait(), threading.current_thread().name)[1] for _ in c], [0, 1], 1
    )
    assert len(set(names)) == 2 and all(n.startswith("hicache-test-fan") for n in names)
    fan.close()
    fan.close()
    assert fan.map_chunks(lambda c: [x + 1 for x in c], [1, 2], 1) == [2, 3]  # starts again
    fan.close()


@pytest.mark.parametrize(("threads", "error"), [(0, ValueError), ("2", TypeError)])
def test_bad_threads_raise(threads: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="threads"):
        Fanout(threads, "t")  # type: ignore[arg-type]
