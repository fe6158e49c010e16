"""Naming a divergence: each rank describes its tree node by node; the rows that differ say
which decision went differently (a backup made on one rank only, a load acked on one rank
only, a node deleted on one rank, another lock count).

A node is named by its path from the root (extra_key, the first and last tokens, depth in
tokens), never by its id or slots (rank-local); its row holds what every rank must agree on.
"""

from __future__ import annotations

from typing import Any

from hicache.stress.checker import walk


def describe(cache: Any) -> list[str]:
    """One row per tree node, sorted (``path | state``: what ``tree_digest`` covers), and one
    of the cache's sizes."""
    storage, host_free = cache.storage_tier, cache.cache_controller.mem_pool_host.available_size()
    rows = [
        f"sizes | evictable={cache.evictable_size()} protected={cache.protected_size()} "
        f"host={cache.host_size()} host_free={host_free}"
    ]
    for node, ids in walk(cache):
        path = f"{node.extra_key!r}:{ids[:4].tolist()}..{ids[-2:].tolist()}@{len(ids)}"
        pinned = storage is not None and storage.pins(node)
        state = (
            f"len={len(node.key)} device={not node.evicted} host={node.backuped} "
            f"pinned={pinned} lock={node.lock_ref} own_lock={node.own_lock_ref} "
            f"hits={node.hit_count} access={node.last_access_time} "
            f"created={node.creation_time} priority={node.priority}"
        )
        rows.append(f"{path} | {state}")
    return sorted(rows)


def diff_rows(per_rank: list[list[str]], limit: int = 12) -> list[str]:
    """The rows not on every rank, with the ranks that have them (at most ``limit``)."""
    sets = [set(rows) for rows in per_rank]
    everywhere = set.intersection(*sets) if sets else set()
    seen: dict[str, list[int]] = {}
    for rank, rows in enumerate(per_rank):
        for row in rows:
            if row not in everywhere:
                seen.setdefault(row, []).append(rank)
    return [f"ranks {ranks}: {row}" for row, ranks in sorted(seen.items())][:limit]
