"""No package imports one above it, so the package graph has no loop.

Every module of ``hicache`` belongs to one unit: its subpackage (``radix``, ``pools``, ...;
``tiers.host`` and ``tiers.storage`` are units of their own, a module directly under ``tiers/``
is ``tiers``), a top-level module by its name (``env``, ``stack``, ...), every ``__main__.py``
to ``__main__`` (commands, on top) and ``hicache/__init__.py`` to ``hicache``. Every import
(module level, ``TYPE_CHECKING``, inside a function) is an edge; an edge between two units must
go down ``LAYERS``, except the re-exports named in ``UPWARD_REEXPORTS``.
"""

from __future__ import annotations

import pytest

from tests.import_graph import MODULES, find_cycle, module_graph

# Lowest first. A unit may import only units before it.
LAYERS = [
    "env",  # every environment variable
    "cli",  # what the command lines share (parsers, --help, log level)
    "checks",  # argument checks
    "threads",  # the wrong-thread guard
    "durations",  # duration histograms (counted by their owners, read in stats())
    "devices",  # every CPU/CUDA difference
    "kernels",  # the transfer ops
    "pools",  # request rows, allocators, device (L1) and host (L2) pools
    "controller",  # host <-> device transfers
    "tp",  # TPGroup and the rank launcher
    "backends",  # storage backends, keys, guard, I/O threads
    "radix",  # the tree core, the tier contract, the device-only cache, the request glue
    "tiers.host",  # the host tier (L2)
    "tiers.storage",  # the storage tier (L3), over a backend
    "tiers",  # HiRadixCache: the chain device -> host -> storage
    "kv_events",  # KV events on the wire (ZMQ, SGLang's format)
    "stack",  # build_kv_stack
    "selfcheck",
    "model",
    "engine",
    "metric_rows",  # cache.stats() as metric samples, and SGLang's names for them
    "metrics",
    "bench",
    "replay",
    "stress",  # the stress harness and the TP fuzz (stress.tp_fuzz)
    "storage",  # the former name of backends, kept for imports
    "__main__",
    "hicache",  # the package's public face
]
# (importer, imported): the only edges allowed to go up. ``hicache.radix`` keeps the name
# ``HiRadixCache`` (its public API); it imports it lazily, on first use.
UPWARD_REEXPORTS = {("hicache.radix", "hicache.tiers.hiradix_cache")}


def unit(module: str) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return "hicache"
    if parts[-1] == "__main__":
        return "__main__"
    if parts[0] == "tiers" and len(parts) > 2:
        return ".".join(parts[:2])
    return parts[0]


def unit_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(importer unit, imported unit) -> the module edges behind it, "a -> b"."""
    edges: dict[tuple[str, str], list[str]] = {}
    for name, targets in graph.items():
        for target in sorted(targets):
            if unit(name) != unit(target) and (name, target) not in UPWARD_REEXPORTS:
                edges.setdefault((unit(name), unit(target)), []).append(f"{name} -> {target}")
    return edges


def upward(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    rank = {name: i for i, name in enumerate(LAYERS)}
    return [m for (a, b), mods in sorted(edges.items()) if rank[a] <= rank[b] for m in mods]


GRAPH = module_graph()


def test_every_unit_has_a_layer() -> None:
    assert {unit(m) for m in MODULES} == set(LAYERS)


def test_no_unit_imports_one_above_it() -> None:
    assert upward(unit_edges(GRAPH)) == []


def test_the_unit_graph_has_no_loop() -> None:
    units: dict[str, set[str]] = {}
    for a, b in unit_edges(GRAPH):
        units.setdefault(a, set()).add(b)
    assert find_cycle(units) is None


@pytest.mark.parametrize("edge", sorted(UPWARD_REEXPORTS))
def test_each_allowed_upward_edge_is_still_there(edge: tuple[str, str]) -> None:
    assert edge[1] in GRAPH[edge[0]]


def test_the_check_sees_an_upward_edge() -> None:
    graph = {"hicache.radix.tree": {"hicache.tiers.host.host_tier"}, "hicache.env": set()}
    assert upward(unit_edges(graph)) == ["hicache.radix.tree -> hicache.tiers.host.host_tier"]
    assert unit("hicache.stress.tp_fuzz.rank") == "stress"
    assert unit("hicache.tiers.hiradix_cache") == "tiers"
    assert unit("hicache.replay.__main__") == "__main__"
