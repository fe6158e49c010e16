"""What a storage backend may report to the guard beyond its results, and the checks of those
results (a malformed one is a miss)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class ReportsFailures(Protocol):
    """A backend that turns its own failures into misses (as the contract asks) and counts
    them: a call during which ``failure_count()`` grew counts as failed for the guard and its
    breaker (e.g. Mooncake's fast RPC_FAIL once the master is gone)."""

    def failure_count(self) -> int: ...


@runtime_checkable
class ReportsFaults(Protocol):
    """A backend that counts its faults by kind (``faults.FaultLog`` kinds); the guard's
    ``stats().faults`` adds them to its own."""

    def fault_counts(self) -> dict[str, int]: ...


def failures_of(backend: object) -> int:
    """A ``ReportsFailures`` backend's ``failure_count()`` (0 for another, or if it raises)."""
    if not isinstance(backend, ReportsFailures):
        return 0
    try:
        return int(backend.failure_count())
    except Exception:
        return 0


def faults_of(backend: object, counts: dict[str, int]) -> dict[str, int]:
    """``counts`` (faults by kind) plus a ``ReportsFaults`` backend's; its counters are not
    worth a failure: if they raise, ``counts`` stand."""
    if isinstance(backend, ReportsFaults):
        try:
            for kind, n in backend.fault_counts().items():
                counts[kind] = counts.get(kind, 0) + n
        except Exception:
            pass
    return counts


def check_bools(result: object, n: int) -> list[bool] | None:
    """``result`` when it is a list of ``n`` bools (a batch read or write), else None."""
    if isinstance(result, list) and len(result) == n and all(isinstance(b, bool) for b in result):
        return result
    return None


def check_count(result: object, n: int) -> int | None:
    """``result`` when it is an int in ``[0, n]`` (a batch query), else None."""
    if isinstance(result, int) and not isinstance(result, bool) and 0 <= result <= n:
        return result
    return None
