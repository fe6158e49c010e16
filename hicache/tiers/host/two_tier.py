"""Device-side steps of a two-tier cache (``HiRadixCache``) that involve its host tier:
eviction that keeps backed-up nodes (and, under ``write_back`` or exclusive tiering, moves
leaves down first), room on the device for a load-back, and the check that no live request
holds a lock before a reset."""

from __future__ import annotations

import time
from collections import Counter

import torch

from hicache.pools import SlotAllocator
from hicache.radix.ledger import Ledger
from hicache.radix.node import TreeNode
from hicache.radix.slots import Slots
from hicache.radix.tree import RadixTree
from hicache.tiers.host.host_tier import HostTier


def evict(ledger: Ledger, host: HostTier, num_tokens: int) -> int:
    """``HiRadixCache.evict`` (contract there): device tokens freed; its duration goes to
    ``ledger.evictions``. A leaf whose write-back is queued is evicted once its write has
    landed (``_move_down``)."""
    start = time.perf_counter()
    freed: list[Slots] = []
    moving: list[TreeNode] = []  # leaves whose write-back is queued, not yet landed
    evicted = queued = 0
    try:
        while evicted < num_tokens:
            node = None if evicted + queued >= num_tokens else ledger.leaves.pop()
            if node is None:
                if not moving:
                    break
                evicted += _move_down(ledger, host, moving, freed)
                moving, queued = [], 0
            elif host.write_back(node):
                moving.append(node)
                queued += len(node.key)
            else:
                if node.host_slots is None and node.children:  # exclusive tiering only
                    host.drop_children(node)
                ledger.leaves.discard(node)  # re-filed when its host-only children went
                evicted += ledger.evict_leaf(node, freed)
        if moving:  # enough was freed meanwhile; the queued leaves still move down
            evicted += _move_down(ledger, host, moving, freed)
    except BaseException:
        host.move_down_later(moving)
        raise
    finally:
        ledger.free(freed)
        ledger.evictions.observe(time.perf_counter() - start)
    return evicted


def _move_down(ledger: Ledger, host: HostTier, moving: list[TreeNode], freed: list[Slots]) -> int:
    """Land the writes of ``moving`` (blocking), then evict those leaves from the device (each
    keeps its node, host-only); returns the device tokens freed."""
    host.drain()
    evicted = 0
    for node in moving:
        if ledger.is_evictable_leaf(node):  # unlocked again by the drain
            ledger.leaves.discard(node)
            evicted += ledger.evict_leaf(node, freed)
    return evicted


def queue_load(
    ledger: Ledger, host: HostTier, allocator: SlotAllocator, chain: list[TreeNode], need: int
) -> torch.Tensor | None:
    """Evict device memory if needed and queue the load of ``chain`` (``need`` tokens); its
    last node stays locked until the load ack. None (nothing changed but evictions) when the
    device cannot make room."""
    last = chain[-1]
    ledger.lock(last)  # the chain and the nodes above it stay put while we evict
    try:
        short = need - allocator.available_size()
        if short > 0:
            evict(ledger, host, short)
        device = host.load(chain)
    except BaseException:
        ledger.unlock(last)
        raise
    if device is None:
        ledger.unlock(last)
    return device


def check_reset(tree: RadixTree, host: HostTier) -> None:
    """``ValueError`` when a node holds a lock other than the pending transfers' own."""
    along: Counter[int] = Counter()  # locks through each node held by pending transfers
    for nodes in host.pending().values():
        for node in nodes:
            along.update(n.id for n in tree.path_to_root(node))
    for node in tree.nodes():
        if node.lock_ref > along[node.id]:
            raise ValueError(
                f"reset: node {node.id} is locked by a live request; finish or release it first"
            )
