"""Building a HiRadixCache's host side: the host KV pool matching the device pool, and the
controller that moves KV between them."""

from __future__ import annotations

from hicache.controller import HiCacheController
from hicache.pools import HostPool, HybridKVPoolHost, SlotAllocator, host_pool_class
from hicache.pools.composite_pool import CompositeKVPool
from hicache.radix.config import HiCacheConfig


def build_host_pool(
    allocator: SlotAllocator | None, page_size: int, config: HiCacheConfig
) -> HostPool:
    """The host pool ``config`` describes for the allocator's device pool: an
    ``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost`` for an MHA / MLA pool, a
    ``HybridKVPoolHost`` for a composite one (``SWAKVPool``, ``HybridLinearKVPool``).

    Pinned when the device pool is on CUDA. ``ValueError`` when the allocator has no device pool,
    the host pool would hold no page (any size above works), or RAM is short; ``TypeError`` for
    a device pool of another type.
    """
    if allocator is None or not callable(getattr(allocator, "get_kvcache", None)):
        raise ValueError("HiRadixCache needs a token_to_kv_pool_allocator with get_kvcache()")
    device_pool = allocator.get_kvcache()
    if device_pool is None:
        raise ValueError("token_to_kv_pool_allocator has no device KV pool (get_kvcache() is None)")
    sizes = (config.hicache_ratio, config.hicache_size_gb, page_size, config.mem_layout)
    if isinstance(device_pool, CompositeKVPool):
        return HybridKVPoolHost(device_pool, *sizes, io_backend=config.io_backend)
    host_cls = host_pool_class(device_pool, "token_to_kv_pool_allocator.get_kvcache()")
    return host_cls(device_pool, *sizes, pin_memory=True, io_backend=config.io_backend)


def build_controller(
    allocator: SlotAllocator | None, page_size: int, config: HiCacheConfig
) -> HiCacheController:
    """A ``HiCacheController`` over ``allocator`` and a new host pool (``build_host_pool``)."""
    host_pool = build_host_pool(allocator, page_size, config)
    assert allocator is not None  # build_host_pool refused None
    return HiCacheController(
        allocator,
        host_pool,
        page_size,
        write_policy=config.write_policy,
        io_backend=config.io_backend,
        verify=config.verify,
        verify_sample_period=config.verify_sample_period,
        layers_ahead=config.layers_ahead,
    )
