"""A digest of a cache's tree that ranks taking the same decisions share (TP debug checks).

It covers the structure (every edge's token ids and namespace, parents first in child order)
and each node's state (which tiers hold it, locks, hits, clock ticks, priority), plus the
cache's sizes; never slot ids or node ids, which are rank- or process-local.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from hicache.radix.node import TreeNode


def tree_digest(
    root: TreeNode, flags: Callable[[TreeNode], Sequence[int]], sizes: Sequence[int]
) -> bytes:
    """SHA-256 (32 bytes) over the tree below ``root``, each node's ``flags(node)`` (small
    ints, e.g. which tiers hold it) and ``sizes``."""
    h = hashlib.sha256()
    stack = [root]
    while stack:
        node = stack.pop()
        h.update(node.key.tobytes())
        state = (
            len(node.key),
            node.lock_ref,
            node.own_lock_ref,
            node.hit_count,
            node.last_access_time,
            node.creation_time,
            node.priority,
            len(node.children),
            *flags(node),
        )
        h.update(repr((node.extra_key, state)).encode())
        stack.extend(reversed(node.children.values()))
    h.update(repr(tuple(sizes)).encode())
    return h.digest()
