"""The host tier of HiRadixCache: its frozen config, host pool construction and invariants.

Kept apart from ``hiradix_cache`` so the cache module holds only tree logic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from hicache.controller import WRITE_POLICIES
from hicache.controller.integrity import check_verify
from hicache.pools import (
    IO_BACKENDS,
    LAYOUTS,
    SUPPORTED_PAIRS,
    HostKVPool,
    MHATokenToKVPool,
    MHATokenToKVPoolHost,
    MLATokenToKVPool,
    MLATokenToKVPoolHost,
)
from hicache.radix.base import check_int
from hicache.radix.invariants import iter_nodes
from hicache.radix.slots import concat_slots

if TYPE_CHECKING:
    from hicache.radix.hiradix_cache import HiRadixCache


# Bound of hicache_ratio and hicache_size_gb: far past any RAM (an exabyte), and low enough that
# the host pool's size arithmetic never overflows a float; past RAM the pool refuses anyway.
_NUMBER_MAX = 1e9


def _check_number(name: str, value: Any) -> None:
    """``TypeError`` unless an int or float (not bool); ``ValueError`` for NaN, an infinity or
    a value outside ``[0, 1e9]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if not 0 <= value <= _NUMBER_MAX:
        shown = f"{value:.6g}" if abs(value) < 1e300 else "a number past 1e300"
        raise ValueError(f"{name} must be in [0, {_NUMBER_MAX:g}], got {shown}")


@dataclass(frozen=True)
class HiCacheConfig:
    """Validated host-tier settings of a HiRadixCache (``TypeError``/``ValueError`` on bad input).

    Attributes
    ----------
    hicache_ratio : host slots = ratio * device slots (when ``hicache_size_gb`` is 0); a finite
        number in ``[0, 1e9]``.
    hicache_size_gb : host pool size in GB (1e9 bytes) when > 0; a finite number in ``[0, 1e9]``.
    write_policy : ``write_through`` (back up on insert), ``write_through_selective`` (back up
        on the 2nd hit) or ``write_back`` (back up when evicted from the device).
    io_backend : ``kernel`` or ``direct``.
    mem_layout : host layout, supported by ``io_backend`` (``hicache.pools.SUPPORTED_PAIRS``).
    load_back_threshold : host hits shorter than this many tokens are recomputed, not loaded.
    verify : page integrity, ``off`` (default), ``sample`` or ``all``: checksums taken at
        backup, checked on the GPU at load-back; a corrupt page is never served but dropped
        from the host tier and recomputed (``hicache.controller.integrity``).
    verify_sample_period : under ``sample``, one load-back in this many is verified.
    """

    hicache_ratio: float = 2.0
    hicache_size_gb: float = 0
    write_policy: str = "write_through"
    io_backend: str = "kernel"
    mem_layout: str = "layer_first"
    load_back_threshold: int = 10
    verify: str = "off"
    verify_sample_period: int = 8

    def __post_init__(self) -> None:
        _check_number("hicache_ratio", self.hicache_ratio)
        _check_number("hicache_size_gb", self.hicache_size_gb)
        if self.write_policy not in WRITE_POLICIES:
            raise ValueError(
                f"write_policy must be one of {WRITE_POLICIES}, got {self.write_policy!r}"
            )
        if self.io_backend not in IO_BACKENDS:
            raise ValueError(f"io_backend must be one of {IO_BACKENDS}, got {self.io_backend!r}")
        if self.mem_layout not in LAYOUTS:
            raise ValueError(f"mem_layout must be one of {LAYOUTS}, got {self.mem_layout!r}")
        if self.mem_layout not in SUPPORTED_PAIRS[self.io_backend]:
            raise ValueError(
                f"mem_layout={self.mem_layout!r} is not supported by io_backend="
                f"{self.io_backend!r}; it supports {SUPPORTED_PAIRS[self.io_backend]}"
            )
        check_int("load_back_threshold", self.load_back_threshold, minimum=0)
        check_verify(self.verify, self.verify_sample_period)

    @property
    def backup_hits(self) -> int | None:
        """Hits a node needs before it is backed up on a match/insert; None: only on eviction."""
        return {"write_through": 0, "write_through_selective": 2}.get(self.write_policy)


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
