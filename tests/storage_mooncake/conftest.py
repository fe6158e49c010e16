"""Fixtures that run a real Mooncake cluster (master + standalone store) over loopback.

They skip, with the reason, when Mooncake Store is not installed (``hicache[mooncake]``) or the
process is not in a loopback-only network namespace (Mooncake's clients listen on 0.0.0.0):
``bash scripts/test.sh`` runs these tests under ``unshare --net``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hicache.backends.mooncake_servers import MooncakeServers, isolation_problem, start_servers

_COUNTER = itertools.count()


def _require_mooncake() -> None:
    pytest.importorskip("mooncake.store", reason="Mooncake Store not installed: hicache[mooncake]")
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)


@pytest.fixture(scope="session")
def mooncake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MooncakeServers]:
    """A shared cluster with a 256 MB store, for the whole session."""
    _require_mooncake()
    with start_servers(tmp_path_factory.mktemp("mooncake"), "256 MB") as servers:
        yield servers


@pytest.fixture
def own_mooncake(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[str], MooncakeServers]]:
    """A factory of clusters for one test (``segment_size`` e.g. ``"32 MB"``), stopped after."""
    _require_mooncake()
    started: list[MooncakeServers] = []

    def start(segment_size: str) -> MooncakeServers:
        logs = tmp_path_factory.mktemp(f"mooncake_own{next(_COUNTER)}")
        started.append(start_servers(Path(logs), segment_size))
        return started[-1]

    yield start
    for servers in started:
        servers.stop()
