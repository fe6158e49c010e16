"""Ledger: the device-side accounting of one tree — sizes, the evictable set, locks, device copies.

Every change to what a node's evictability depends on (its locks, its device copy, its
children's device copies) goes through the ledger, which re-files the node in its evictable
``LeafSet`` (and, through ``LowerTier.refile``, in a lower tier's set) in the same call.
Sizes count device tokens: ``evictable_tokens`` in unlocked nodes, ``protected_tokens`` in
locked ones. The ledger implements ``tier.TierSite``: it is what a lower tier reaches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from hicache.durations import DurationHistogram
from hicache.pools import SlotAllocator
from hicache.radix.events import DEVICE, NodeEvents
from hicache.radix.evict_plain import evict_plain
from hicache.radix.node import TreeNode
from hicache.radix.ownership import SlotOwners
from hicache.radix.policies import LeafSet
from hicache.radix.slots import Slots, concat_slots
from hicache.radix.stats import DeviceStats
from hicache.radix.tier import LowerTier, NodeWatch
from hicache.radix.tree import RadixTree

_CPU = torch.device("cpu")


class Ledger:
    """Accounting over ``tree``; evicted device slots go back to ``allocator`` (None: none).

    Attributes
    ----------
    leaves : the evictable device leaves, in eviction order: unlocked, on the device, with no
        child on the device (no child at all without a lower tier).
    evictable_tokens, protected_tokens : device tokens in unlocked / locked nodes (ledger-only).
    evicted_tokens : device tokens ``evict_leaf`` has freed (a counter, never reset).
    evictions : a histogram of each eviction pass's duration (``evict``, the cache's own).
    owners : the ``SlotOwners`` of the device slots nodes hold.
    lower : the tier below the device, or None.
    events : where the device tier's KV events go, or None (events off).
    watch : told of each dropped device copy and deleted node (``tier.NodeWatch``), or None.
    keep : given the CPU int64 slots a ``free`` gives back, returns those to free now; the
        others a lower tier still reads and frees itself later (``HostTier.unheld``); or None.
    """

    def __init__(
        self,
        tree: RadixTree,
        allocator: SlotAllocator | None,
        device: torch.device,
        policy: str,
        owners: SlotOwners,
        events: NodeEvents | None = None,
    ) -> None:
        self.tree, self.allocator, self.device, self.owners = tree, allocator, device, owners
        # ``TierSite``'s queries: the tree's own (the tree is never replaced)
        self.path_to_root, self.nodes = tree.path_to_root, tree.nodes
        self.events = events
        self.leaves = LeafSet(policy)
        self.evictable_tokens = self.protected_tokens = self.evicted_tokens = 0
        self.evictions = DurationHistogram()
        self.lower: LowerTier | None = None
        self._lower_leaves: LeafSet | None = None
        self.watch: NodeWatch | None = None
        self.keep: Callable[[torch.Tensor], torch.Tensor] | None = None

    def attach(self, lower: LowerTier) -> None:
        """Put ``lower`` below the device (before the first node is added)."""
        self.lower, self._lower_leaves = lower, lower.leaves

    def clear(self) -> None:
        """Forget every node (the tree was cleared; their slots were freed)."""
        self.leaves.clear()
        self.evictable_tokens = self.protected_tokens = 0

    # ---- queries -----------------------------------------------------------------------------

    def is_evictable_leaf(self, node: TreeNode) -> bool:
        if node.lock_ref or node.slots is None:
            return False
        if self.lower is None or not node.children:
            return not node.children
        return all(child.slots is None for child in node.children.values())

    def stats(self) -> DeviceStats:
        a = self.allocator
        size, free = (None, None) if a is None else (a.size, a.available_size())
        tokens = self.evicted_tokens, self.evictable_tokens, self.protected_tokens
        return DeviceStats(*tokens, size, free, self.evictions.snapshot())

    # ---- locks and hits ----------------------------------------------------------------------

    def lock(self, node: TreeNode) -> int:
        """Lock ``node`` and its ancestors; returns device tokens moved to protected. The root
        is a no-op; ``TypeError``/``ValueError`` if ``node`` is not in this tree."""
        path = self.tree.path_to_root(node)
        moved = 0
        leaves, lower = self.leaves, self._lower_leaves
        for n in path:
            if n.lock_ref == 0:
                if n.slots is not None:
                    size = len(n.key)
                    self.evictable_tokens -= size
                    self.protected_tokens += size
                    moved += size
                if n.id in leaves.members:  # most nodes of a path are no leaf: no call
                    leaves.discard(n)
                if lower is not None and n.id in lower.members:
                    lower.discard(n)
            n.lock_ref += 1
        node.own_lock_ref += 1 if path else 0
        return moved

    def unlock(self, node: TreeNode) -> int:
        """Undo one ``lock(node)``; returns device tokens moved to evictable. ``ValueError`` (no
        change) unless ``node`` holds a lock of its own."""
        path = self.tree.path_to_root(node)
        if path and node.own_lock_ref <= 0:
            held = "only through a locked descendant" if node.lock_ref > 0 else "at all"
            raise ValueError(
                f"dec_lock_ref: node {node.id} is not locked {held}; "
                "call it once per inc_lock_ref on the same node"
            )
        node.own_lock_ref -= 1 if path else 0  # the root holds no lock of its own
        moved = 0
        # ``sync`` of a node just unlocked, inline: a locked node is in no leaf set. On the
        # device, it is an evictable leaf iff childless or (with a lower tier) without a device
        # child (``below``, the path's previous node, on the device spares the children's scan).
        lower, add, below = self.lower, self.leaves.add, None
        for n in path:
            n.lock_ref -= 1
            if n.lock_ref == 0:
                if n.slots is not None:
                    size = len(n.key)
                    self.evictable_tokens += size
                    self.protected_tokens -= size
                    moved += size
                    if not n.children or (
                        lower is not None
                        and (below is None or below.slots is None)
                        and all(c.slots is None for c in n.children.values())
                    ):
                        add(n)
                elif lower is not None:
                    lower.refile(n)
            below = n
        return moved

    def hit(self, path: list[TreeNode], tick: int, priority: int | None = None) -> None:
        """Record a match or insert reaching every node of ``path`` (recency, hit count,
        priority), keeping their leaf-set entries current."""
        leaves, lower = self.leaves, self._lower_leaves
        for node in path:
            member = node.id in leaves.members and leaves.discard(node)
            lower_member = lower is not None and node.id in lower.members and lower.discard(node)
            node.last_access_time = tick
            node.hit_count += 1
            if priority is not None and priority > node.priority:
                node.priority = priority
            if member:
                leaves.add(node)
            if lower_member and lower is not None:
                lower.add(node)

    def sync(self, node: TreeNode, device_child: bool = False) -> None:
        """Re-file ``node`` in the evictable set(s); ``device_child``: a child is on the device."""
        if node is not self.tree.root:
            member = not device_child and self.is_evictable_leaf(node)
            if member != (node.id in self.leaves.members):  # else nothing to re-file
                self.leaves.put(node, member)
            if self.lower is not None:
                self.lower.refile(node)

    # ---- nodes and their device copies -------------------------------------------------------

    def add_leaf(self, leaf: TreeNode, child_key: Any) -> None:
        """Link the new unlocked device leaf ``leaf`` (its slots its own) under its parent."""
        parent = leaf.parent
        assert leaf.slots is not None and parent is not None and not leaf.lock_ref
        self.tree.link_leaf(leaf, child_key)
        self.owners.take(leaf.slots)
        self.evictable_tokens += len(leaf.key)
        self._device_child(parent)
        self.leaves.add(leaf)  # unlocked, on the device, childless: an evictable leaf
        if self.events is not None:
            self.events.stored(leaf, DEVICE)

    def add_host_leaf(self, leaf: TreeNode, child_key: Any) -> None:
        """Link the new leaf ``leaf`` (no device copy, a lower tier's) under its parent."""
        assert leaf.slots is None and leaf.parent is not None
        self.tree.link_leaf(leaf, child_key)
        self.sync(leaf.parent)
        self.sync(leaf)

    def delete_leaf(self, node: TreeNode) -> None:
        if self.watch is not None:
            self.watch.deleted(node)
        self.sync(self.tree.unlink_leaf(node))

    def give_device(self, node: TreeNode, slots: Slots) -> None:
        parent = node.parent
        assert node.slots is None and parent is not None
        self._resize(node, len(node.key))
        node.slots = slots
        self.owners.take(slots)
        self._device_child(parent)
        # ``sync(node)`` inline: no device leaf before (no copy), now no lower tier's leaf
        lower = self._lower_leaves
        if lower is not None and node.id in lower.members:
            lower.discard(node)
        if not node.lock_ref and (not node.children or self.is_evictable_leaf(node)):
            self.leaves.add(node)
        if self.events is not None:
            self.events.stored(node, DEVICE)

    def drop_device(self, node: TreeNode) -> None:
        self.free([self._take_device(node)])

    def evict_leaf(self, node: TreeNode, freed: list[Slots]) -> int:
        """Evict the device leaf ``node`` just popped from ``leaves``; its slots go to
        ``freed``. A node the lower tier holds stays as a node without a device copy."""
        assert node.slots is not None
        freed.append(node.slots)
        self.evicted_tokens += len(node.key)
        if self.lower is not None and self.lower.holds(node):
            self._take_device(node)
        else:
            if self.events is not None:
                self.events.removed(node, DEVICE)
            self.evictable_tokens -= len(node.key)
            self.delete_leaf(node)
        return len(node.key)

    def evict(self, num_tokens: int) -> int:
        """Evict leaves in eviction order until at least ``num_tokens`` device tokens are freed
        (or none is left), free their slots in one call, and return the tokens freed."""
        start = time.perf_counter()
        freed: list[Slots] = []
        if self.lower is None and self.events is None:
            evicted = evict_plain(self.tree, self.leaves, num_tokens, freed)
            self.evicted_tokens += evicted
            self.evictable_tokens -= evicted
        else:
            evicted, pop = 0, self.leaves.pop
            while evicted < num_tokens and (node := pop()) is not None:
                evicted += self.evict_leaf(node, freed)
        self.free(freed)
        self.evictions.observe(time.perf_counter() - start)
        return evicted

    def free(self, slots: list[Slots]) -> None:
        """Give device ``slots`` (no node's now) back to the allocator as CPU indices (its
        bookkeeping is on the CPU: a free never asks the device)."""
        slots = list(filter(len, slots))  # the empty ones dropped (builtins: no Python call)
        if self.allocator is None or not slots:
            return
        merged = concat_slots(slots, _CPU)
        if self.keep is not None:
            merged = self.keep(merged)
        self.allocator.free(merged)
        self.owners.release(merged)

    def _take_device(self, node: TreeNode) -> Slots:
        """Remove ``node``'s device copy (not freed); returns its slots."""
        slots = node.slots
        assert slots is not None and node.parent is not None
        if self.events is not None:
            self.events.removed(node, DEVICE)
        self._resize(node, -len(node.key))
        node.slots = None
        if self.watch is not None:
            self.watch.device_dropped(node)
        self.sync(node)
        self.sync(node.parent)
        return slots

    def _device_child(self, parent: TreeNode) -> None:
        """``sync(parent, True)`` inline: with a device child, ``parent`` is a leaf of neither
        set (a lower tier's leaves are childless; the root is in neither)."""
        if parent.id in self.leaves.members:
            self.leaves.discard(parent)
        lower = self._lower_leaves
        if lower is not None and parent.id in lower.members:
            lower.discard(parent)

    def _resize(self, node: TreeNode, tokens: int) -> None:
        if node.lock_ref:
            self.protected_tokens += tokens
        else:
            self.evictable_tokens += tokens
