"""Device-side steps of a two-tier cache (``HiRadixCache``) that involve its host tier:
eviction that keeps backed-up nodes (and, under ``write_back``, backs leaves up first), room on
the device for a load-back, and the check that no live request holds a lock before a reset."""

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
    ``ledger.evictions``."""
    start = time.perf_counter()
    freed: list[Slots] = []
    evicted = queued = 0
    try:
        while evicted < num_tokens:
            node = None if evicted + queued >= num_tokens else ledger.leaves.pop()
            if node is None:
                if not queued:
                    break
                host.drain()  # the written nodes come back as evictable
                queued = 0
            elif host.write_back(node):
                queued += len(node.key)
            else:
                evicted += ledger.evict_leaf(node, freed)
        if queued:  # enough was freed meanwhile; still land the writes and unlock their nodes
            host.drain()
    finally:
        ledger.free(freed)
        ledger.evictions.observe(time.perf_counter() - start)
    return evicted


def queue_load(
    ledger: Ledger, host: HostTier, allocator: SlotAllocator, chain: list[TreeNode]
) -> torch.Tensor | None:
    """Evict device memory if needed and queue the load of ``chain``; its last node stays
    locked until the load ack. None (nothing changed but evictions) when the device cannot
    make room."""
    last = chain[-1]
    need = sum(len(node.key) for node in chain)
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
