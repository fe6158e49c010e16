"""The host tier of HiRadixCache: host pool construction and invariants.

Kept apart from ``hiradix_cache`` so the cache module holds only tree logic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from hicache.pools import (
    HostKVPool,
    MHATokenToKVPool,
    MHATokenToKVPoolHost,
    MLATokenToKVPool,
    MLATokenToKVPoolHost,
)
from hicache.radix.config import HiCacheConfig
from hicache.radix.invariants import iter_nodes
from hicache.radix.slots import concat_slots

if TYPE_CHECKING:
    from hicache.radix.hiradix_cache import HiRadixCache


def build_host_pool(allocator: Any, page_size: int, config: HiCacheConfig) -> HostKVPool:
    """The host pool (MHA or MLA, by the allocator's device pool type) ``config`` describes.

    Pinned when the device pool is on CUDA. ``ValueError`` when the allocator has no device pool,
    the host pool would not be larger than the device pool, or RAM is short; ``TypeError`` for
    a device pool that is neither MHA nor MLA.
    """
    if allocator is None or not callable(getattr(allocator, "get_kvcache", None)):
        raise ValueError("HiRadixCache needs a token_to_kv_pool_allocator with get_kvcache()")
    device_pool = allocator.get_kvcache()
    if device_pool is None:
        raise ValueError("token_to_kv_pool_allocator has no device KV pool (get_kvcache() is None)")
    if isinstance(device_pool, MLATokenToKVPool):
        host_cls: type[HostKVPool] = MLATokenToKVPoolHost
    elif isinstance(device_pool, MHATokenToKVPool):
        host_cls = MHATokenToKVPoolHost
    else:
        raise TypeError(
            "token_to_kv_pool_allocator.get_kvcache() must be an MHATokenToKVPool or "
            f"MLATokenToKVPool, got {type(device_pool).__name__}"
        )
    return host_cls(
        device_pool,
        config.hicache_ratio,
        config.hicache_size_gb,
        page_size,
        config.mem_layout,
        pin_memory=True,
        io_backend=config.io_backend,
    )


def _fail(message: str) -> None:
    raise RuntimeError(f"hierarchical cache invariant violated: {message}")


def check_host_tier(cache: HiRadixCache) -> None:
    """The host-tier half of ``HiRadixCache.check_invariants`` (``RuntimeError`` on a violation).

    Host slots: each free in the host pool or owned by exactly one node's ``host_value``, with
    none unaccounted. Host-evictable leaf set: exactly the unlocked host-only childless nodes,
    with fresh sort keys. Locked nodes are on the device. Nodes awaiting a transfer ack are in
    the tree and locked.
    """
    nodes = list(iter_nodes(cache))
    for node in nodes:
        member = node in cache._host_evictable
        if member != cache._is_host_leaf(node):
            _fail(f"node {node.id}: host-evictable-set membership {member} is wrong")
        if member and cache._host_evictable.stale(node):
            _fail(f"node {node.id}: its host-evictable-set sort key is stale")
        if node.lock_ref and node.slots is None:
            _fail(f"node {node.id} is locked but has no device copy")
    if sum(node in cache._host_evictable for node in nodes) != len(cache._host_evictable):
        _fail("the host-evictable set holds nodes that are not in the tree")
    ids = {node.id for node in nodes}
    for name, waiting in (("write", cache._writing), ("load", cache._loading)):
        for node_id, node in waiting.items():
            if node_id not in ids or node.lock_ref <= 0:
                _fail(f"node {node_id} awaits a {name} ack but is not a locked tree node")
    _check_host_slots(cache, nodes)


def _check_host_slots(cache: HiRadixCache, nodes: list) -> None:
    host_pool = cache.cache_controller.mem_pool_host
    host_pool.check_invariants()
    held = concat_slots(
        [n.host_slots for n in nodes if n.host_slots is not None], torch.device("cpu")
    )
    if held.unique().numel() != held.numel():
        _fail("a host slot is owned by two tree positions")
    free = host_pool.free_slots()
    if bool(torch.isin(held, free).any()):
        _fail("a host slot is both in the tree and free in the host pool")
    if held.numel() != cache.host_size():
        _fail(f"host_size() is {cache.host_size()}, the nodes hold {held.numel()} host slots")
    if held.numel() + free.numel() != host_pool.size:
        _fail(
            f"host slots leaked: {host_pool.size - held.numel() - free.numel()} are neither "
            "free nor owned by a node"
        )
