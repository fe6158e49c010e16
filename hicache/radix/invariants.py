"""Invariant checks of the tree and of the device accounting, and a text drawing of the tree.

Each owner's state is checked through its public queries: ``check_tree`` (``RadixTree``: links,
keys, slots' shapes, lock counts), ``check_ledger`` (``Ledger``: evictable set, sizes, slot
ownership); the host tier checks itself (``host_checks``). Everything here is O(nodes +
tokens) and meant for tests and debugging, never the serving path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NoReturn, Protocol

import numpy as np
import torch

from hicache.radix.config import RadixCacheConfig
from hicache.radix.key import TOKEN_DTYPE, check_extra_key
from hicache.radix.ledger import Ledger
from hicache.radix.node import TreeNode
from hicache.radix.slots import Slots, concat_slots
from hicache.radix.tree import RadixTree

_INT64 = (np.dtype(np.int64), torch.int64)


class Drawable(Protocol):
    """What ``format_tree`` and ``iter_nodes`` read of a cache."""

    @property
    def root(self) -> TreeNode: ...
    @property
    def config(self) -> RadixCacheConfig: ...
    def evictable_size(self) -> int: ...
    def protected_size(self) -> int: ...


def iter_nodes(cache: Drawable) -> Iterator[TreeNode]:
    """Every node of ``cache`` except the root, parents before children."""
    stack = list(cache.root.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def _fail(message: str) -> NoReturn:
    raise RuntimeError(f"radix tree invariant violated: {message}")


def _check_slots(name: str, node: TreeNode, slots: Slots | None) -> None:
    if slots is None:
        return
    if slots.dtype not in _INT64 or slots.ndim != 1 or slots.shape[0] != len(node.key):
        _fail(
            f"node {node.id}: {name} must be int64 [{len(node.key)}], "
            f"got {slots.dtype} {tuple(slots.shape)}"
        )


def _valid_namespace(extra_key: object) -> bool:
    try:
        check_extra_key(extra_key)
    except TypeError:
        return False
    return True


def _check_node(tree: RadixTree, node: TreeNode) -> None:
    parent, page, root = node.parent, tree.page_size, tree.root
    if parent is None or parent.children.get(tree.child_key(parent, node)) is not node:
        _fail(f"node {node.id} is not its parent's child under its first page")
    if node.child_key != tree.child_key(parent, node):
        _fail(f"node {node.id}: its cached child_key is not its first page")
    if node.key.dtype != TOKEN_DTYPE or node.key.ndim != 1:
        _fail(f"node {node.id}: key must be a 1-D {TOKEN_DTYPE.__name__} array")
    if len(node.key) == 0 or len(node.key) % page:
        _fail(f"node {node.id}: key length {len(node.key)} is not a positive page multiple")
    base = node.key.base
    if isinstance(base, np.ndarray) and 2 * node.key.nbytes < base.nbytes:
        _fail(f"node {node.id}: its key views a buffer more than twice its size")
    _check_slots("value", node, node.slots)
    _check_slots("host_value", node, node.host_slots)
    if node.slots is None and node.host_slots is None:
        _fail(f"node {node.id} holds neither device nor host slots")
    if parent is root and not _valid_namespace(node.extra_key):
        _fail(f"node {node.id}: extra_key {node.extra_key!r:.60} is not a valid namespace")
    if parent is not root:
        if node.extra_key != parent.extra_key:
            _fail(f"node {node.id}: extra_key differs from its parent's")
        if node.slots is not None and parent.slots is None:
            _fail(f"node {node.id} is on the device but its parent is not")
    below = sum(child.lock_ref for child in node.children.values())
    if node.own_lock_ref < 0 or node.lock_ref != node.own_lock_ref + below:
        _fail(
            f"node {node.id}: lock_ref {node.lock_ref} is not its own locks "
            f"{node.own_lock_ref} plus its children's {below}"
        )


def _check_slot_ownership(ledger: Ledger, nodes: list[TreeNode]) -> None:
    allocator = ledger.allocator
    if allocator is None:
        return  # pure index: values are token ids and may repeat
    values = [n.slots for n in nodes if n.slots is not None]
    slots = concat_slots(values, torch.device("cpu"))
    if torch.unique(slots).numel() != slots.numel():
        _fail("a device slot is owned by two tree positions")
    held = ledger.owners.held()
    if held is not None and not np.array_equal(held, np.sort(slots.numpy())):
        _fail("slot_owners disagrees with the slots the nodes hold")
    free_slots = getattr(allocator, "free_slots", None)
    if free_slots is not None and bool(torch.isin(slots, free_slots().cpu()).any()):
        _fail("a device slot is both in the tree and free in the allocator")


def check_tree(tree: RadixTree) -> list[TreeNode]:
    """Raise ``RuntimeError`` naming the first broken structural invariant (docs/design.md);
    returns the nodes below the root."""
    root = tree.root
    if root.parent is not None or len(root.key) or root.lock_ref != 1:
        _fail("the root must have no parent, an empty key, lock_ref 1 and never be evictable")
    nodes = list(tree.nodes())
    if len({n.id for n in nodes}) != len(nodes):
        _fail("node ids repeat")
    for node in nodes:
        _check_node(tree, node)
    return nodes


def check_ledger(ledger: Ledger, nodes: list[TreeNode]) -> None:
    """Raise ``RuntimeError`` unless the evictable set, the sizes and the slot ownership
    ``ledger`` keeps agree with ``nodes`` (every node below the root)."""
    leaves = ledger.leaves
    if ledger.tree.root in leaves:
        _fail("the root must have no parent, an empty key, lock_ref 1 and never be evictable")
    evictable = protected = members = 0
    for node in nodes:
        member = node in leaves
        if member != ledger.is_evictable_leaf(node):
            _fail(f"node {node.id}: evictable-set membership {member} is wrong")
        if member and leaves.stale(node):
            _fail(f"node {node.id}: its evictable-set sort key is stale")
        size = 0 if node.slots is None else len(node.key)
        evictable += 0 if node.lock_ref else size
        protected += size if node.lock_ref else 0
        members += member
    sizes = (ledger.evictable_tokens, ledger.protected_tokens)
    if (evictable, protected) != sizes:
        _fail(
            f"sizes (evictable, protected) are {sizes}, the nodes hold ({evictable}, {protected})"
        )
    if members != len(leaves):
        _fail("the evictable set holds nodes that are not in the tree")
    _check_slot_ownership(ledger, nodes)


def _describe(node: TreeNode, max_tokens: int) -> str:
    ids = node.key[:max_tokens].tolist()
    more = " ..." if len(node.key) > max_tokens else ""
    flags = "".join(
        flag for flag, on in ((" evicted", node.evicted), (" backuped", node.backuped)) if on
    )
    return (
        f"#{node.id} {ids}{more} len={len(node.key)} lock={node.lock_ref} "
        f"hits={node.hit_count} t={node.last_access_time}{flags}"
    )


def format_tree(cache: Drawable, max_tokens: int = 8) -> str:
    """One line per node, indented by depth, children in insertion order."""
    lines = [
        f"root evictable={cache.evictable_size()} protected={cache.protected_size()} "
        f"page_size={cache.config.page_size} policy={cache.config.eviction_policy}"
    ]
    stack = [(child, 1) for child in reversed(cache.root.children.values())]
    while stack:
        node, depth = stack.pop()
        lines.append("  " * depth + _describe(node, max_tokens))
        stack.extend((child, depth + 1) for child in reversed(node.children.values()))
    return "\n".join(lines)
