"""Whole-tree walks of a RadixCache: invariant checks and a text drawing (tests and debugging).

Everything here is O(nodes + tokens); nothing is on the serving path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch

from hicache.radix.key import TOKEN_DTYPE, check_extra_key
from hicache.radix.node import TreeNode
from hicache.radix.slots import Slots, concat_slots
from hicache.radix.walk import child_key

_INT64 = (np.dtype(np.int64), torch.int64)

if TYPE_CHECKING:
    from hicache.radix.radix_cache import RadixCache


def iter_nodes(cache: RadixCache) -> Iterator[TreeNode]:
    """Every node except the root, parents before children (iterative: chains may be deep)."""
    stack = list(cache.root.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def _fail(message: str) -> None:
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


def _check_node(cache: RadixCache, node: TreeNode) -> None:
    parent, page = node.parent, cache.page_size
    if parent is None or parent.children.get(child_key(cache, parent, node)) is not node:
        _fail(f"node {node.id} is not its parent's child under its first page")
    if node.child_key != child_key(cache, parent, node):
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
    if parent is cache.root and not _valid_namespace(node.extra_key):
        _fail(f"node {node.id}: extra_key {node.extra_key!r:.60} is not a valid namespace")
    if parent is not cache.root:
        if node.extra_key != parent.extra_key:
            _fail(f"node {node.id}: extra_key differs from its parent's")
        if node.slots is not None and parent.slots is None:
            _fail(f"node {node.id} is on the device but its parent is not")
        if node.host_slots is not None and parent.host_slots is None:
            _fail(f"node {node.id} is backed up but its parent is not")
    below = sum(child.lock_ref for child in node.children.values())
    if node.own_lock_ref < 0 or node.lock_ref != node.own_lock_ref + below:
        _fail(
            f"node {node.id}: lock_ref {node.lock_ref} is not its own locks "
            f"{node.own_lock_ref} plus its children's {below}"
        )
    member = node in cache._evictable
    if member != cache._is_evictable_leaf(node):
        _fail(f"node {node.id}: evictable-set membership {member} is wrong")
    if member and cache._evictable.stale(node):
        _fail(f"node {node.id}: its evictable-set sort key is stale")


def _check_slot_ownership(cache: RadixCache, nodes: list[TreeNode]) -> None:
    allocator = cache.token_to_kv_pool_allocator
    if allocator is None:
        return  # pure index: values are token ids and may repeat
    values = [n.slots for n in nodes if n.slots is not None]
    slots = concat_slots(values, cache.device).cpu()
    if slots.unique().numel() != slots.numel():
        _fail("a device slot is owned by two tree positions")
    held = cache.slot_owners.held()
    if held is not None and not np.array_equal(held, np.sort(slots.numpy())):
        _fail("slot_owners disagrees with the slots the nodes hold")
    free_slots = getattr(allocator, "free_slots", None)
    if free_slots is not None and bool(torch.isin(slots, free_slots().cpu()).any()):
        _fail("a device slot is both in the tree and free in the allocator")


def check_tree(cache: RadixCache) -> None:
    """Raise ``RuntimeError`` naming the first broken invariant (see docs/design.md)."""
    root = cache.root
    if root.parent is not None or len(root.key) or root.lock_ref != 1 or root in cache._evictable:
        _fail("the root must have no parent, an empty key, lock_ref 1 and never be evictable")
    nodes = list(iter_nodes(cache))
    if len({n.id for n in nodes}) != len(nodes):
        _fail("node ids repeat")
    evictable = protected = members = 0
    for node in nodes:
        _check_node(cache, node)
        size = cache._device_len(node)
        evictable += 0 if node.lock_ref else size
        protected += size if node.lock_ref else 0
        members += node in cache._evictable
    if (evictable, protected) != (cache.evictable_size(), cache.protected_size()):
        _fail(
            f"sizes (evictable, protected) are ({cache.evictable_size()}, "
            f"{cache.protected_size()}), the nodes hold ({evictable}, {protected})"
        )
    if members != len(cache._evictable):
        _fail("the evictable set holds nodes that are not in the tree")
    _check_slot_ownership(cache, nodes)


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


def format_tree(cache: RadixCache, max_tokens: int = 8) -> str:
    """One line per node, indented by depth, children in insertion order."""
    lines = [
        f"root evictable={cache.evictable_size()} protected={cache.protected_size()} "
        f"page_size={cache.page_size} policy={cache.config.eviction_policy}"
    ]
    stack = [(child, 1) for child in reversed(cache.root.children.values())]
    while stack:
        node, depth = stack.pop()
        lines.append("  " * depth + _describe(node, max_tokens))
        stack.extend((child, depth + 1) for child in reversed(node.children.values()))
    return "\n".join(lines)
