"""RadixTree: the structure of the radix tree — walking, splitting, linking, paths.

Children are found by the bytes of their first page (``(extra_key, bytes)`` under the root, so
namespaces never share a node). An edge is compared with the key by ``key.match_len``: one
memcmp over both buffers (the C helper) or one vectorised numpy comparison, never token by token.

Pure structure: the tree relinks nodes (``parent``, ``children``, ``child_key``, ``key``,
``slots``, ``host_slots``) and never touches sizes, locks or leaf sets. A split leaves both
halves' evictability and sizes unchanged (the new upper node takes the lower node's
``lock_ref``); whoever changes what evictability depends on re-files the node (``Ledger``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator

import numpy as np

from hicache.radix.key import TOKEN_DTYPE, RadixKey, edge_ids, match_len, page_bytes
from hicache.radix.node import ChildKey, TreeNode
from hicache.radix.slots import Slots, head_slots


class RadixTree:
    """The nodes of one cache, from ``root`` (empty key, no parent, ``lock_ref == 1``)."""

    def __init__(self, page_size: int, root_slots: Slots) -> None:
        self.page_size = page_size
        self._root_slots = root_slots
        self.root = self._new_root()

    def _new_root(self) -> TreeNode:
        root = TreeNode(np.empty(0, TOKEN_DTYPE), self._root_slots, None)
        root.lock_ref = 1  # the root is never evicted; lock walks stop below it
        return root

    def clear(self) -> None:
        """Forget every node: a fresh root."""
        self.root = self._new_root()

    # ---- walking -----------------------------------------------------------------------------

    def walk(
        self, ids: np.ndarray, extra_key: Hashable | None
    ) -> tuple[list[TreeNode], ChildKey | None]:
        """Nodes matching the whole pages of ``ids`` from the root, splitting the last one where
        the match ends inside it; and the child key of the first unmatched page (None if none
        is left)."""
        page = self.page_size
        n = len(ids) - len(ids) % page
        path: list[TreeNode] = []
        if not n:
            return path, None
        look: ChildKey = (extra_key, page_bytes(ids, 0, page))
        child, pos = self.root.children.get(look), 0
        while child is not None:
            key = child.key
            matched = match_len(key, ids, pos, n, page)
            if matched < len(key):
                child = self.split(child, matched)
            pos += matched
            path.append(child)
            if pos >= n:
                return path, None
            look = page_bytes(ids, pos, page)
            child = child.children.get(look)
        return path, look

    def peek(
        self, ids: np.ndarray, extra_key: Hashable | None
    ) -> tuple[list[TreeNode], TreeNode | None, int]:
        """Read-only ``walk``: the nodes whose whole key matches the whole pages of ``ids``, the
        node the match ends inside (or None) and how many of its tokens match. Splits nothing."""
        page = self.page_size
        n = len(ids) - len(ids) % page
        path: list[TreeNode] = []
        pos = 0
        child = self.root.children.get((extra_key, page_bytes(ids, 0, page))) if n else None
        while child is not None:
            matched = match_len(child.key, ids, pos, n, page)
            if matched < len(child.key):
                return path, (child if matched else None), matched
            path.append(child)
            pos += matched
            child = child.children.get(page_bytes(ids, pos, page)) if pos < n else None
        return path, None, 0

    def device_prefix(self, key: RadixKey) -> tuple[int, list[TreeNode]]:
        """Read-only: how many leading tokens of ``key`` the tree holds on the device, and the
        device nodes whose whole key is among them (root side first)."""
        path, partial, matched = self.peek(key.token_ids, key.extra_key)
        length = 0
        for i, node in enumerate(path):
            if node.slots is None:
                return length, path[:i]
            length += len(node.key)
        if partial is not None and partial.slots is not None:
            length += matched
        return length, path

    # ---- changing the structure --------------------------------------------------------------

    def split(self, node: TreeNode, at: int) -> TreeNode:
        """Split ``node`` at page-aligned ``at``; returns the new upper node (keys ``[:at]``).

        Each half of the key is a view or a copy as ``edge_ids`` decides (never pinning more
        than twice its bytes); the upper part gets a copy of the slots (so it never pins the
        lower part's buffers); slots, host_slots and hash_value split alike; lock_ref and
        access statistics carry over to both halves.
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
        if node.comp is not None:  # a state stays at the lower end; a tombstone covers both
            upper.comp = node.comp.upper_half()
        if node.hash_value is not None:  # the same pages: divided, never recomputed
            pages = at // self.page_size
            upper.hash_value, node.hash_value = node.hash_value[:pages], node.hash_value[pages:]
        node.key = edge_ids(node.key[at:])
        node.slots = None if node.slots is None else node.slots[at:]
        node.host_slots = None if node.host_slots is None else node.host_slots[at:]
        upper.child_key, node.child_key = node.child_key, self.child_key(upper, node)
        parent.children[upper.child_key] = upper
        upper.children[node.child_key] = node
        node.parent = upper
        return upper

    def link_leaf(self, leaf: TreeNode, child_key: ChildKey) -> None:
        """Link the new node ``leaf`` under its ``parent`` at ``child_key`` (its
        :meth:`child_key`, as ``walk`` returned it)."""
        assert leaf.parent is not None and not leaf.children, "only new leaves are linked"
        leaf.child_key = child_key
        leaf.parent.children[child_key] = leaf

    def unlink_leaf(self, node: TreeNode) -> TreeNode:
        """Remove the leaf ``node`` from its parent; returns the parent."""
        parent = node.parent
        assert parent is not None and not node.children, "only attached leaves are deleted"
        del parent.children[node.child_key]
        node.parent = None
        return parent

    # ---- queries -----------------------------------------------------------------------------

    def child_key(self, parent: TreeNode, child: TreeNode) -> ChildKey:
        """The key of ``child`` in ``parent.children``: its first page's bytes (with its
        ``extra_key`` under the root)."""
        first = child.key[: self.page_size].tobytes()
        return (child.extra_key, first) if parent is self.root else first

    def nodes(self) -> Iterator[TreeNode]:
        """Every node except the root, parents before children (iterative: chains may be deep)."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def path_to_root(self, node: TreeNode) -> list[TreeNode]:
        """``node`` and its ancestors below the root, deepest first; ``TypeError`` for a
        non-node, ``ValueError`` if ``node`` is not in this tree."""
        if not isinstance(node, TreeNode):
            raise TypeError(f"node must be a TreeNode, got {type(node).__name__}")
        path, current, root = [], node, self.root
        while current is not root:
            if current.parent is None:
                raise ValueError(f"node {node.id} is not in this tree")
            path.append(current)
            current = current.parent
        return path
