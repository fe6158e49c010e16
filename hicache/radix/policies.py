"""Eviction policies as sort keys, and the ordered set of evictable leaves they order.

A policy maps a node to a tuple; the node with the smallest tuple is evicted first. Every policy
breaks ties by recency (least recently used first), then by node id, so the order is total and
deterministic. ``LeafSet`` keeps the evictable leaves sorted under one policy and is updated
incrementally: add/discard/pop are O(log n), so evicting k nodes costs O(k log n).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sortedcontainers import SortedList

from hicache.radix.node import TreeNode

PolicyKey = Callable[[TreeNode], tuple[int, ...]]

EVICTION_POLICIES: dict[str, PolicyKey] = {
    "lru": lambda n: (n.last_access_time,),
    "lfu": lambda n: (n.hit_count, n.last_access_time),
    "fifo": lambda n: (n.creation_time, n.last_access_time),
    "mru": lambda n: (-n.last_access_time,),
    "filo": lambda n: (-n.creation_time, n.last_access_time),
    "priority": lambda n: (n.priority, n.last_access_time),
}
"""name -> sort key; smaller is evicted first. ``priority``: lower priority goes first."""


def check_policy(name: object) -> str:
    """``name`` if it is a known policy, else ``ValueError`` listing the allowed names."""
    if not isinstance(name, str) or name not in EVICTION_POLICIES:
        raise ValueError(
            f"eviction_policy must be one of {sorted(EVICTION_POLICIES)}, got {name!r}"
        )
    return name


class LeafSet:
    """Nodes ordered by an eviction policy, each held with the sort key it had when added.

    A member's policy fields (access time, hit count, priority) must not change while it is in
    the set: discard it, update it, add it again (the cache does this in one place).
    """

    def __init__(self, policy: str) -> None:
        self.policy = check_policy(policy)
        self._key = EVICTION_POLICIES[policy]
        # Entries are (*policy key, node.id, node); ids are unique, so nodes are never compared.
        self._sorted: SortedList = SortedList()
        self._entries: dict[int, tuple] = {}

    def add(self, node: TreeNode) -> None:
        assert node.id not in self._entries, f"node {node.id} is already in the leaf set"
        entry = (*self._key(node), node.id, node)
        self._entries[node.id] = entry
        self._sorted.add(entry)

    def discard(self, node: TreeNode) -> bool:
        """Remove ``node`` if present; returns whether it was."""
        entry = self._entries.pop(node.id, None)
        if entry is None:
            return False
        self._sorted.remove(entry)
        return True

    def pop(self) -> TreeNode | None:
        """Remove and return the node to evict first; None when empty."""
        if not self._entries:
            return None
        node: TreeNode = self._sorted.pop(0)[-1]
        del self._entries[node.id]
        return node

    def stale(self, node: TreeNode) -> bool:
        """Whether ``node``'s stored sort key differs from its current one (invariant checks)."""
        return self._entries[node.id][:-2] != self._key(node)

    def clear(self) -> None:
        self._sorted.clear()
        self._entries.clear()

    def __contains__(self, node: TreeNode) -> bool:
        return node.id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[TreeNode]:
        """Members in eviction order."""
        return (entry[-1] for entry in self._sorted)
