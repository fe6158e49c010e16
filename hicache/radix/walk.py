"""Walking a RadixCache along a key, and splitting an edge where a match ends inside it.

Children are found by the bytes of their first page (``(extra_key, bytes)`` under the root, so
namespaces never share a node). A whole edge that matches is settled by one bytes comparison;
otherwise one vectorised numpy comparison finds the first differing page, never token by token.

A friend module of ``RadixCache`` (split out to keep that module short, and called on every
match and insert, so it takes the cache rather than unpacking it): it reads ``root`` and
``page_size``, grows the reusable bool buffer ``_scratch``, and relinks nodes (``parent``,
``children``, ``child_key``, ``key``, ``slots``, ``host_slots``). It never touches sizes or leaf
sets: a split leaves both halves' evictability and sizes unchanged (the caller re-files what
its own changes affect).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

import numpy as np

from hicache.radix.key import BYTES_COMPARE_MAX, RadixKey, common_prefix_len, edge_ids
from hicache.radix.node import ChildKey, TreeNode
from hicache.radix.slots import head_slots

if TYPE_CHECKING:
    from hicache.radix.radix_cache import RadixCache


def walk(
    cache: RadixCache, ids: np.ndarray, extra_key: Hashable | None
) -> tuple[list[TreeNode], ChildKey | None]:
    """Nodes matching the whole pages of ``ids`` from the root, splitting the last one where the
    match ends inside it; and the child key of the first unmatched page (None if none is left).
    """
    page = cache.page_size
    n = len(ids) - len(ids) % page
    path: list[TreeNode] = []
    if not n:
        return path, None
    look: ChildKey = (extra_key, ids[:page].tobytes())
    child, pos = cache.root.children.get(look), 0
    while child is not None:
        key = child.key
        end = pos + len(key)
        if end <= n and len(key) <= BYTES_COMPARE_MAX and (key.tobytes() == ids[pos:end].tobytes()):
            pos = end
        else:
            if n > len(cache._scratch):
                cache._scratch = np.empty(n, dtype=bool)
            matched = common_prefix_len(key, ids[pos:n], page, cache._scratch)
            if matched < len(key):
                child = split_node(cache, child, matched)
            pos += matched
        path.append(child)
        if pos >= n:
            return path, None
        look = ids[pos : pos + page].tobytes()
        child = child.children.get(look)
    return path, look


def split_node(cache: RadixCache, node: TreeNode, at: int) -> TreeNode:
    """Split ``node`` at page-aligned ``at``; returns the new upper node (keys ``[:at]``).

    Each half of the key is a view or a copy as ``edge_ids`` decides (never pinning more than
    twice its bytes); the upper part gets a copy of the slots (so it never pins the lower part's
    buffers); slots and host_slots split alike; lock_ref and access statistics carry over to both
    halves.
    """
    parent = node.parent
    assert parent is not None and 0 < at < len(node.key), "bad split"
    upper = TreeNode(
        edge_ids(node.key[:at]),
        head_slots(node.slots, at),
        parent,
        extra_key=node.extra_key,
        tick=node.creation_time,
        priority=node.priority,
    )
    upper.host_slots = head_slots(node.host_slots, at)
    upper.lock_ref, upper.hit_count = node.lock_ref, node.hit_count
    upper.last_access_time = node.last_access_time
    node.key = edge_ids(node.key[at:])
    node.slots = None if node.slots is None else node.slots[at:]
    node.host_slots = None if node.host_slots is None else node.host_slots[at:]
    upper.child_key, node.child_key = node.child_key, child_key(cache, upper, node)
    parent.children[upper.child_key] = upper
    upper.children[node.child_key] = node
    node.parent = upper
    return upper


def child_key(cache: RadixCache, parent: TreeNode, child: TreeNode) -> ChildKey:
    """The key of ``child`` in ``parent.children``: its first page's bytes (with its
    ``extra_key`` under the root)."""
    first = child.key[: cache.page_size].tobytes()
    return (child.extra_key, first) if parent is cache.root else first


def peek(
    cache: RadixCache, ids: np.ndarray, extra_key: Hashable | None
) -> tuple[list[TreeNode], TreeNode | None, int]:
    """Read-only ``walk``: the nodes whose whole key matches the whole pages of ``ids``, the
    node the match ends inside (or None) and how many of its tokens match. Splits nothing."""
    page = cache.page_size
    n = len(ids) - len(ids) % page
    path: list[TreeNode] = []
    pos = 0
    child = cache.root.children.get((extra_key, ids[:page].tobytes())) if n else None
    while child is not None:
        matched = common_prefix_len(child.key, ids[pos:n], page)
        if matched < len(child.key):
            return path, (child if matched else None), matched
        path.append(child)
        pos += matched
        child = child.children.get(ids[pos : pos + page].tobytes()) if pos < n else None
    return path, None, 0


def device_prefix(cache: RadixCache, key: RadixKey) -> tuple[int, list[TreeNode]]:
    """Read-only: how many leading tokens of ``key`` the tree holds on the device, and the
    device nodes whose whole key is among them (root side first)."""
    path, partial, matched = peek(cache, key.token_ids, key.extra_key)
    length = 0
    for i, node in enumerate(path):
        if node.slots is None:
            return length, path[:i]
        length += len(node.key)
    if partial is not None and partial.slots is not None:
        length += matched
    return length, path
