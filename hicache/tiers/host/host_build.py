"""Building a HiRadixCache's host side: the host KV pool matching the device pool, and the
controller that moves KV between them."""

from __future__ import annotations

from hicache.controller import HiCacheController
from hicache.pools import (
    HostKVPool,
    MHATokenToKVPool,
    MHATokenToKVPoolHost,
    MLATokenToKVPool,
    MLATokenToKVPoolHost,
    SlotAllocator,
)
from hicache.radix.config import HiCacheConfig


def build_host_pool(
    allocator: SlotAllocator | None, page_size: int, config: HiCacheConfig
) -> HostKVPool:
    """The host pool (MHA or MLA, by the allocator's device pool type) ``config`` describes.

    Pinned when the device pool is on CUDA. ``ValueError`` when the allocator has no device pool,
    the host pool would hold no page (any size above works), or RAM is short; ``TypeError`` for
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
