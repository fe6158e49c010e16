"""Device eviction of a tree without a lower tier or events: the ledger's fast path."""

from __future__ import annotations

from hicache.radix.policies import LeafSet
from hicache.radix.slots import Slots
from hicache.radix.tree import RadixTree


def evict_plain(tree: RadixTree, leaves: LeafSet, num_tokens: int, freed: list[Slots]) -> int:
    """``Ledger.evict_leaf`` in a loop, for a tree without a lower tier or events: pop leaves
    of ``leaves`` until ``num_tokens`` device tokens are evicted (or none is left), delete each
    (its slots go to ``freed``) and re-file its parent only if that became an evictable leaf.
    Returns the tokens evicted; the caller settles its sizes once."""
    evicted, root = 0, tree.root
    pop, add, unlink = leaves.pop, leaves.add, tree.unlink_leaf
    while evicted < num_tokens and (node := pop()) is not None:
        slots = node.slots
        assert slots is not None  # a member of ``leaves`` is on the device
        freed.append(slots)
        evicted += len(node.key)
        parent = unlink(node)
        if (
            parent is not root
            and not parent.children
            and not parent.lock_ref
            and parent.slots is not None
        ):
            add(parent)
    return evicted
