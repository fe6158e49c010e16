"""Eviction policies as sort keys, and the ordered set of evictable leaves they order.

A policy maps a node to a tuple; the node with the smallest tuple is evicted first. Every policy
breaks ties by recency (least recently used first), then by node id, so the order is total and
deterministic. ``LeafSet`` keeps the evictable leaves sorted under one policy and is updated
incrementally: add/discard/pop are O(log n) (O(1) for a node just touched under ``lru``), so
evicting k nodes costs O(k log n).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from heapq import merge
from typing import Any

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

    Members sit in one of two sorted runs. ``_tail`` is an insertion-ordered dict that takes an
    add in O(1) when its entry sorts after the tail's last one: the common case, since a node
    just touched carries the newest tick (``lru``, and every policy while ties hold). Other adds
    go to ``_sorted`` (O(log n)). ``pop`` takes the smaller of the two heads.
    """

    def __init__(self, policy: str) -> None:
        self.policy = check_policy(policy)
        self._key = EVICTION_POLICIES[policy]
        self._lru = policy == "lru"
        # Entries are (*policy key, node.id, node); ids are unique, so nodes are never compared.
        # ``members``: every member's id -> its entry. Callers only read it: ``node.id in
        # members`` asks for membership without a call (the ledger's hot loops).
        self.members: dict[int, tuple[Any, ...]] = {}
        self._tail: OrderedDict[int, tuple[Any, ...]] = (
            OrderedDict()
        )  # ascending entries, by node id
        self._tail_max: tuple[Any, ...] = ()  # >= every entry in _tail (the last one added there)
        self._sorted: SortedList = SortedList()  # the members not in _tail

    def add(self, node: TreeNode) -> None:
        assert node.id not in self.members, f"node {node.id} is already in the leaf set"
        if self._lru:  # the default policy's key, without its call
            entry: tuple[Any, ...] = (node.last_access_time, node.id, node)
        else:
            entry = (*self._key(node), node.id, node)
        self.members[node.id] = entry
        if not self._tail or entry > self._tail_max:
            self._tail[node.id] = self._tail_max = entry
        else:
            self._sorted.add(entry)

    def put(self, node: TreeNode, member: bool) -> None:
        """Add ``node`` if ``member`` and absent (a present node keeps its entry), else discard."""
        if not member:
            self.discard(node)
        elif node.id not in self.members:
            self.add(node)

    def discard(self, node: TreeNode) -> bool:
        """Remove ``node`` if present; returns whether it was."""
        entry = self.members.pop(node.id, None)
        if entry is None:
            return False
        if self._tail.pop(node.id, None) is None:
            self._sorted.remove(entry)
        return True

    def pop(self) -> TreeNode | None:
        """Remove and return the node to evict first; None when empty."""
        if not self.members:
            return None
        tail, ordered = self._tail, self._sorted
        if tail and not (ordered and ordered[0] < tail[next(iter(tail))]):
            entry = tail.popitem(last=False)[1]
        else:
            entry = ordered.pop(0)
        del self.members[entry[-2]]
        node: TreeNode = entry[-1]
        return node

    def stale(self, node: TreeNode) -> bool:
        """Whether ``node``'s stored sort key differs from its current one (invariant checks)."""
        return self.members[node.id][:-2] != self._key(node)

    def clear(self) -> None:
        self.members.clear()
        self._tail.clear()
        self._sorted.clear()

    def __contains__(self, node: TreeNode) -> bool:
        return node.id in self.members

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self) -> Iterator[TreeNode]:
        """Members in eviction order."""
        return (entry[-1] for entry in merge(self._tail.values(), self._sorted))
