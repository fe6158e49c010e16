"""A tiny fully wired cache stack with live state, and a snapshot of everything a call may change.

The bad-input catalogue and the fault-injection tests run an action against a :class:`World` and
compare :func:`snapshot` before and after: slot counts, free lists, every KV byte of both tiers,
the controller's queues and the radix tree's shape and statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hicache.controller import HiCacheController
from hicache.pools import (
    MHATokenToKVPool,
    MHATokenToKVPoolHost,
    MLATokenToKVPool,
    MLATokenToKVPoolHost,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from hicache.radix import HiRadixCache, RadixCache, RadixKey
from hicache.radix.invariants import format_tree

PAGE = 2
LAYERS = 2
HEADS, DIM = 2, 4  # float32: item_size = 32 bytes


@dataclass
class World:
    """Device pool of 8 pages, host pool 2x, a controller, request rows and a radix tree.

    Live state: two tree entries (one locked), one request row in use, one queued write and one
    issued load, random bytes in both tiers.
    """

    allocator: TokenToKVPoolAllocator
    device_pool: Any
    host_pool: Any
    controller: HiCacheController
    req_pool: ReqToTokenPool
    tree: RadixCache
    locked: Any
    row: int


def device_pool(kind: str, size: int, page: int = PAGE, layers: int = LAYERS) -> Any:
    if kind == "mha":
        return MHATokenToKVPool(size, page, torch.float32, HEADS, DIM, layers, "cpu")
    return MLATokenToKVPool(size, page, torch.float32, DIM, 4, layers, "cpu")


def host_pool(dev: Any, layout: str, ratio: float = 2.0) -> Any:
    cls = MHATokenToKVPoolHost if isinstance(dev, MHATokenToKVPool) else MLATokenToKVPoolHost
    return cls(dev, ratio, 0, dev.page_size, layout)


def make_world(
    kind: str = "mha", layout: str = "layer_first", io_backend: str = "kernel", pages: int = 8
) -> World:
    dev = device_pool(kind, pages * PAGE)
    allocator = TokenToKVPoolAllocator(pages * PAGE, PAGE, "cpu", kvcache=dev)
    host = host_pool(dev, layout)
    ctrl = HiCacheController(allocator, host, PAGE, io_backend=io_backend)
    req_pool = ReqToTokenPool(4, 16, "cpu")
    tree = RadixCache(req_pool, allocator, PAGE)
    gen = torch.Generator().manual_seed(0)
    for part in [*dev.part_buffers, [host.kv_buffer]]:
        for buf in part:
            raw = buf.view(torch.uint8)
            raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    tree.insert(RadixKey([1, 2, 3, 4]), allocator.alloc(4))
    tree.insert(RadixKey([1, 2, 7, 8, 9, 9]), allocator.alloc(6))
    locked = tree.match_prefix([1, 2, 7, 8]).last_device_node
    tree.inc_lock_ref(locked)
    (row,) = req_pool.alloc(1)
    ctrl.write(allocator.alloc(2), node_id=1)
    ctrl.load(host.alloc(2), node_id=2)
    ctrl.start_loading()
    return World(allocator, dev, host, ctrl, req_pool, tree, locked, row)


def _bytes(buffers: list[torch.Tensor]) -> list[torch.Tensor]:
    return [b.view(torch.uint8).clone() for b in buffers]


def snapshot(w: World) -> dict[str, Any]:
    """Everything a public call could change, as comparable values."""
    ctrl = w.controller
    return {
        "device_free": w.allocator.free_slots().tolist(),
        "device_available": w.allocator.available_size(),
        "host_free": w.host_pool.free_slots().tolist(),
        "host_available": w.host_pool.available_size(),
        "device_bytes": _bytes([b for part in w.device_pool.part_buffers for b in part]),
        "host_bytes": _bytes([w.host_pool.kv_buffer]),
        "queues": [
            len(q)
            for q in (ctrl.write_queue, ctrl.load_queue, ctrl.ack_write_queue, ctrl.ack_load_queue)
        ],
        "counter": (ctrl.layer_done_counter.producer_index, ctrl.layer_done_counter.consumer_index),
        "rows": (w.req_pool.available_size(), w.req_pool.req_to_token.clone()),
        "tree": (format_tree(w.tree), w.tree.evictable_size(), w.tree.protected_size()),
    }


def assert_same(before: dict[str, Any], after: dict[str, Any]) -> None:
    for name, old in before.items():
        new = after[name]
        if isinstance(old, list) and old and isinstance(old[0], torch.Tensor):
            same = all(torch.equal(a, b) for a, b in zip(old, new, strict=True))
        elif name == "rows":
            same = old[0] == new[0] and torch.equal(old[1], new[1])
        else:
            same = old == new
        assert same, f"{name} changed"


def check_all(w: World) -> None:
    """Every component's own invariant check."""
    w.allocator.check_invariants()
    w.host_pool.check_invariants()
    w.tree.check_invariants()


@dataclass
class HiWorld:
    """A write_back HiRadixCache (device 16 slots, host 32) with a host-only node ``host``, a
    device-only node ``device`` and a locked device node ``locked``."""

    cache: HiRadixCache
    host: Any
    device: Any
    locked: Any


def make_hi_world() -> HiWorld:
    dev = device_pool("mha", 16, page=1)
    allocator = TokenToKVPoolAllocator(16, 1, "cpu", kvcache=dev)
    cache = HiRadixCache(None, allocator, 1, write_policy="write_back", load_back_threshold=1)
    cache.insert([5, 6, 7, 8], allocator.alloc(4))
    assert cache.evict(4) == 4
    cache.insert([1, 2, 3, 4], allocator.alloc(4))
    cache.insert([9, 9], allocator.alloc(2))
    host, device, locked = (
        cache.match_prefix(k).last_host_node for k in ([5, 6, 7, 8], [1, 2, 3, 4], [9, 9])
    )
    cache.inc_lock_ref(locked)
    return HiWorld(cache, host, device, locked)


def snapshot_hi(w: HiWorld) -> dict[str, Any]:
    cache = w.cache
    ctrl = cache.cache_controller
    return {
        "device_free": cache.token_to_kv_pool_allocator.free_slots().tolist(),
        "host_free": ctrl.mem_pool_host.free_slots().tolist(),
        "tree": (
            format_tree(cache),
            cache.evictable_size(),
            cache.protected_size(),
            cache.host_size(),
        ),
        "queues": [
            len(q)
            for q in (ctrl.write_queue, ctrl.load_queue, ctrl.ack_write_queue, ctrl.ack_load_queue)
        ],
    }
