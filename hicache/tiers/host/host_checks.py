"""Invariant checks of a ``HostTier`` through its public queries (``RuntimeError`` naming the
first broken rule). O(nodes + host slots): tests and debugging only."""

from __future__ import annotations

from typing import NoReturn

import torch

from hicache.radix.components import host_state_of, host_swa_gone
from hicache.radix.node import TreeNode
from hicache.radix.slots import concat_slots
from hicache.tiers.host.host_components import HostComponents
from hicache.tiers.host.host_tier import HostTier


def _fail(message: str) -> NoReturn:
    raise RuntimeError(f"hierarchical cache invariant violated: {message}")


def check_host_tier(tier: HostTier, nodes: list[TreeNode]) -> None:
    """The host-tier half of ``HiRadixCache.check_invariants`` over ``nodes`` (every node).

    Host slots: each free in the host pool or owned by exactly one node's ``host_value``, with
    none unaccounted. Host-evictable leaf set: exactly the unlocked host-only childless nodes,
    with fresh sort keys. Locked nodes are on the device. Nodes awaiting a transfer ack are in
    the tree and locked. Tiering: inclusive, a backed-up node's parent is the root or backed
    up; exclusive, a node holds both copies only while a transfer reads one (``settling``).
    """
    leaves = tier.leaves
    _check_tiering(tier, nodes)
    for node in nodes:
        member = node in leaves
        if member != tier.is_evictable_leaf(node):
            _fail(f"node {node.id}: host-evictable-set membership {member} is wrong")
        if member and leaves.stale(node):
            _fail(f"node {node.id}: its host-evictable-set sort key is stale")
        if node.lock_ref and node.slots is None:
            _fail(f"node {node.id} is locked but has no device copy")
    if sum(node in leaves for node in nodes) != len(leaves):
        _fail("the host-evictable set holds nodes that are not in the tree")
    ids = {node.id for node in nodes}
    for name, waiting in tier.pending().items():
        for node in waiting:
            if node.id not in ids or node.lock_ref <= 0:
                _fail(f"node {node.id} awaits a {name} ack but is not a locked tree node")
    _check_host_slots(tier, nodes)


def _check_tiering(tier: HostTier, nodes: list[TreeNode]) -> None:
    if not tier.exclusive:
        for node in nodes:
            parent = node.parent
            assert parent is not None  # a tree node below the root
            if node.host_slots is not None and parent.parent is not None:  # not the root's child
                if parent.host_slots is None:
                    _fail(f"node {node.id} is backed up but its parent is not")
        return
    settling = tier.settling()
    for node in nodes:
        if node.slots is not None and node.host_slots is not None and node.id not in settling:
            _fail(f"node {node.id} holds a device and a host copy under exclusive tiering")


def _check_host_slots(tier: HostTier, nodes: list[TreeNode]) -> None:
    host_pool = tier.controller.mem_pool_host
    host_pool.check_invariants()
    held = concat_slots(
        [n.host_slots for n in nodes if n.host_slots is not None], torch.device("cpu")
    )
    if torch.unique(held).numel() != held.numel():
        _fail("a host slot is owned by two tree positions")
    free = host_pool.free_slots()
    if bool(torch.isin(held, free).any()):
        _fail("a host slot is both in the tree and free in the host pool")
    if held.numel() != tier.size():
        _fail(f"host_size() is {tier.size()}, the nodes hold {held.numel()} host slots")
    owned = held.numel() + free.numel() + tier.reserved()
    if owned != host_pool.size:
        _fail(
            f"host slots leaked: {host_pool.size - owned} are neither free, owned by a node "
            "nor reserved for a prefetch"
        )


def check_host_components(components: HostComponents, nodes: list[TreeNode]) -> None:
    """A hybrid tree's host copies: exactly the nodes in the host state LRU hold a host
    state, each backed up, each a distinct slot; only backed-up nodes flag host SWA gone."""
    holders = [n for n in nodes if host_state_of(n.comp) is not None]
    if set(holders) != set(components.host_lru):
        _fail("the host state LRU is not the set of nodes holding a host state")
    slots = [host_state_of(n.comp) for n in holders]
    if len(set(slots)) != len(slots):
        _fail("a host state slot is held by two nodes")
    for node in nodes:
        if node.host_slots is None and (node in components.host_lru or host_swa_gone(node.comp)):
            _fail(f"node {node.id} has host components but no host copy")
    pool = components.host_states
    if pool is not None and pool.available_size() + len(slots) != pool.size:
        _fail(f"host state slots leaked: {pool.available_size()} free + {len(slots)} held")
