"""Bad-input catalogue: every public entry point refuses bad input cleanly.

Each row runs one bad call against a live :class:`~tests.stress.world.World` and asserts the
exception type, that its message names the offending argument, that nothing changed (slot counts,
free lists, KV bytes of both tiers, queues, request rows, the tree) and that every invariant
check still passes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from hicache import kernels
from hicache.controller import HiCacheController, LayerDoneCounter
from hicache.pools import MLATokenToKVPoolHost, TokenToKVPoolAllocator
from hicache.radix import HiRadixCache, RadixCache, RadixKey, Req, TreeNode
from tests.stress.world import (
    PAGE,
    HiWorld,
    World,
    assert_same,
    check_all,
    device_pool,
    host_pool,
    make_hi_world,
    make_world,
    snapshot,
    snapshot_hi,
)

Action = Callable[[World], Any]


def idx(*values: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def _per_layer(w: World, src_idx: Any, dst_idx: Any, item_size: int = 32, **kw: Any) -> None:
    """Host layer 0 -> device layer 0 with the given indices (the device is the destination)."""
    hk, hv = w.host_pool.k_buffer[0], w.host_pool.v_buffer[0]
    dk, dv = w.device_pool.k_buffer[0], w.device_pool.v_buffer[0]
    kernels.transfer_kv_per_layer(hk, dk, hv, dv, src_idx, dst_idx, item_size, **kw)


def _all_layer(w: World, table: torch.Tensor, layers: int = 2) -> None:
    d = w.device_pool
    kernels.transfer_kv_all_layer(
        table, d.k_data_ptrs, table, d.v_data_ptrs, idx(0), idx(2), 32, layers
    )


def _pf_lf(w: World, layer_id: int) -> None:
    src = w.host_pool.k_buffer.view(w.host_pool.size, -1)  # host slots as [items, L * item]
    dst = w.device_pool.k_buffer[0]
    kernels.transfer_kv_per_layer_pf_lf(src, dst, src, dst, idx(0), idx(2), layer_id, 32, 64)


def _direct(w: World, src_idx: torch.Tensor, dst_idx: torch.Tensor) -> None:
    src = [w.host_pool.k_buffer[0]]
    kernels.transfer_kv_direct(src, [w.device_pool.k_buffer[0]], src_idx, dst_idx, PAGE)


def _set_kv(w: World, layer: int = 0, loc: Any = None, k: Any = None, v: Any = None) -> None:
    loc = idx(2, 3) if loc is None else loc
    k = torch.zeros(len(loc), 2, 4) if k is None else k
    v = torch.zeros(len(loc), 2, 4) if v is None else v
    w.device_pool.set_kv_buffer(layer, loc, k, v)


def _backup(w: World, host_idx: Any, dev_idx: Any, io_backend: str = "kernel") -> None:
    w.host_pool.backup_from_device_all_layer(w.device_pool, host_idx, dev_idx, io_backend)


def _load(w: World, layer: int = 0, io_backend: str = "kernel") -> None:
    w.host_pool.load_to_device_per_layer(w.device_pool, idx(0, 1), idx(2, 3), layer, io_backend)


def _controller(w: World, **kw: Any) -> HiCacheController:
    return HiCacheController(w.allocator, w.host_pool, PAGE, **kw)


def _sibling(node: TreeNode) -> TreeNode:
    """Another child of ``node``'s parent, found without a match (which records a hit)."""
    return next(c for c in node.parent.children.values() if c is not node)


def _req(w: World, kv_len: int) -> Req:
    return Req(w.row, [1, 2, 3, 4], kv_len=kv_len)


KERNELS: list[tuple[str, Action, type[Exception], str]] = [
    (
        "int32 indices",
        lambda w: _per_layer(w, idx(0, 1, dtype=torch.int32), idx(2, 3)),
        TypeError,
        "src_indices must be int64",
    ),
    (
        "list indices",
        lambda w: _per_layer(w, [0, 1], idx(2, 3)),
        TypeError,
        "src_indices must be a torch.Tensor",
    ),
    (
        "2-D indices",
        lambda w: _per_layer(w, idx(0, 1)[None], idx(2, 3)[None]),
        ValueError,
        "src_indices must be 1-D",
    ),
    (
        "length mismatch",
        lambda w: _per_layer(w, idx(0, 1), idx(2)),
        ValueError,
        "src_indices and dst_indices differ in length",
    ),
    (
        "item_size % 8",
        lambda w: _per_layer(w, idx(0), idx(2), item_size=12),
        ValueError,
        "item_size must be a multiple of 8",
    ),
    (
        "item_size vs tensors",
        lambda w: _per_layer(w, idx(0), idx(2), item_size=64),
        ValueError,
        "bytes per dim-0 row",
    ),
    (
        "dst index out of range",
        lambda w: _per_layer(w, idx(0, 1), idx(2, 10**6)),
        IndexError,
        "dst_indices holds 1000000",
    ),
    (
        "negative src index",
        lambda w: _per_layer(w, idx(-1), idx(2)),
        IndexError,
        "src_indices holds -1",
    ),
    (
        "block_quota 0",
        lambda w: _per_layer(w, idx(0), idx(2), block_quota=0),
        ValueError,
        "block_quota must be >= 1",
    ),
    (
        "warps not a power of two",
        lambda w: _per_layer(w, idx(0), idx(2), num_warps_per_block=3),
        ValueError,
        "num_warps_per_block must be a power of two",
    ),
    (
        "pf_lf layer_id out of range",
        lambda w: _pf_lf(w, 2),
        IndexError,
        "layer_id 2 is out of range",
    ),
    (
        "int64 pointer table",
        lambda w: _all_layer(w, w.device_pool.k_data_ptrs.to(torch.int64)),
        TypeError,
        "src_k_layers must be a uint64 pointer table",
    ),
    (
        "pointer table too short",
        lambda w: _all_layer(w, w.device_pool.k_data_ptrs[:1]),
        ValueError,
        "src_k_layers must hold num_layers=2",
    ),
    (
        "null pointer",
        lambda w: _all_layer(w, torch.zeros(2, dtype=torch.uint64)),
        ValueError,
        "src_k_layers holds a null",
    ),
    (
        "direct: not a page multiple",
        lambda w: _direct(w, idx(0), idx(2)),
        ValueError,
        "must be a multiple of page_size",
    ),
    (
        "direct: dst out of range",
        lambda w: _direct(w, idx(0, 1), idx(10**6, 10**6 + 1)),
        IndexError,
        "dst_indices holds",
    ),
    (
        "direct: empty layer list",
        lambda w: kernels.transfer_kv_direct([], [], idx(), idx(), 1),
        TypeError,
        "src_layers must be a non-empty list",
    ),
]

POOLS: list[tuple[str, Action, type[Exception], str]] = [
    (
        "alloc not a page multiple",
        lambda w: w.allocator.alloc(3),
        ValueError,
        "n must be a multiple of page_size=2",
    ),
    ("alloc negative", lambda w: w.allocator.alloc(-2), ValueError, "n must be >= 0"),
    ("alloc float", lambda w: w.allocator.alloc(2.0), TypeError, "n must be an int"),
    (
        "free reserved slot",
        lambda w: w.allocator.free(idx(0, 1)),
        ValueError,
        "indices must lie in",
    ),
    (
        "free float tensor",
        lambda w: w.allocator.free(torch.tensor([2.0])),
        TypeError,
        "indices must be an integer tensor",
    ),
    ("free a list", lambda w: w.allocator.free([2, 3]), TypeError, "indices must be a torch"),
    (
        "free unallocated",
        lambda w: w.allocator.free(idx(16, 17)),
        ValueError,
        "indices frees pages that are not allocated",
    ),
    (
        "free slot twice in one call",
        lambda w: w.allocator.free(idx(2, 2)),
        ValueError,
        "indices contains a slot more than once",
    ),
    (
        "host free unallocated",
        lambda w: w.host_pool.free(idx(30, 31)),
        ValueError,
        "indices frees pages that are not allocated",
    ),
    (
        "set_kv wrong shape",
        lambda w: _set_kv(w, k=torch.zeros(2, 2, 5)),
        ValueError,
        "cache_k must have shape",
    ),
    (
        "set_kv wrong dtype",
        lambda w: _set_kv(w, v=torch.zeros(2, 2, 4, dtype=torch.float16)),
        TypeError,
        "cache_v must have dtype",
    ),
    (
        "set_kv loc out of range",
        lambda w: _set_kv(w, loc=idx(2, 99)),
        ValueError,
        "loc must lie in",
    ),
    (
        "set_kv float loc",
        lambda w: _set_kv(w, loc=torch.tensor([2.0, 3.0])),
        TypeError,
        "loc must be a 1-D int64",
    ),
    ("set_kv bad layer", lambda w: _set_kv(w, layer=5), ValueError, "layer_id must be in"),
    (
        "load bad io_backend",
        lambda w: _load(w, io_backend="dma"),
        ValueError,
        "io_backend must be one of",
    ),
    (
        "load unsupported pair",
        lambda w: host_pool(w.device_pool, "page_first").load_to_device_per_layer(
            w.device_pool, idx(0, 1), idx(2, 3), 0, "direct"
        ),
        ValueError,
        "layout='page_first' is not supported by io_backend='direct'",
    ),
    ("load bad layer", lambda w: _load(w, layer=2), ValueError, "layer_id must be in"),
    (
        "backup host index out of range",
        lambda w: _backup(w, idx(10**6, 10**6 + 1), idx(2, 3)),
        IndexError,
        "host_indices must lie in",
    ),
    (
        "backup device index out of range",
        lambda w: _backup(w, idx(0, 1), idx(2, 10**6)),
        IndexError,
        "device_indices must lie in",
    ),
    (
        "backup to a foreign device pool",
        lambda w: w.host_pool.backup_from_device_all_layer(
            device_pool("mha", 16, layers=3), idx(0, 1), idx(2, 3), "kernel"
        ),
        ValueError,
        "device_pool does not match",
    ),
    (
        "host pool of no page",
        lambda w: host_pool(w.device_pool, "layer_first", 0.0),
        ValueError,
        "must hold at least one page",
    ),
    (
        "host pool unknown layout",
        lambda w: host_pool(w.device_pool, "row_major"),
        ValueError,
        "layout must be one of",
    ),
    (
        "MLA host pool page_head",
        lambda w: MLATokenToKVPoolHost(device_pool("mla", 8), 2.0, 0, PAGE, "page_head"),
        ValueError,
        "layout must be one of",
    ),
    (
        "allocator size not a page multiple",
        lambda w: TokenToKVPoolAllocator(7, 2),
        ValueError,
        "size must be a multiple of page_size",
    ),
    (
        "row free twice",
        lambda w: w.req_pool.free(w.row + 1),
        ValueError,
        "free_index must be distinct",
    ),
    ("row alloc negative", lambda w: w.req_pool.alloc(-1), ValueError, "need_size must be >= 0"),
]

CONTROLLER: list[tuple[str, Action, type[Exception], str]] = [
    (
        "write int32 indices",
        lambda w: w.controller.write(idx(2, 3, dtype=torch.int32), 7),
        TypeError,
        "device_indices must be a 1-D int64",
    ),
    (
        "write partial page",
        lambda w: w.controller.write(idx(2), 7),
        ValueError,
        "device_indices must hold a positive multiple of page_size=2",
    ),
    (
        "write out-of-range slots",
        lambda w: w.controller.write(idx(10**6, 10**6 + 1), 7),
        IndexError,
        "device_indices must lie in",
    ),
    (
        "load empty",
        lambda w: w.controller.load(idx(), 7),
        ValueError,
        "host_indices must hold a positive multiple",
    ),
    (
        "load out-of-range slots",
        lambda w: w.controller.load(idx(10**6, 10**6 + 1), 7),
        IndexError,
        "host_indices must lie in",
    ),
    (
        "evict_device unallocated",
        lambda w: w.controller.evict_device(idx(16, 17)),
        ValueError,
        "not allocated",
    ),
    (
        "evict_host unallocated",
        lambda w: w.controller.evict_host(idx(30, 31)),
        ValueError,
        "not allocated",
    ),
    (
        "unknown write_policy",
        lambda w: _controller(w, write_policy="write_around"),
        ValueError,
        "write_policy must be one of",
    ),
    (
        "unknown io_backend",
        lambda w: _controller(w, io_backend="dma"),
        ValueError,
        "io_backend must be one of",
    ),
    (
        "layout without the backend",
        lambda w: HiCacheController(
            w.allocator, host_pool(w.device_pool, "page_first"), PAGE, io_backend="direct"
        ),
        ValueError,
        "mem_pool_host.layout='page_first' is not supported by io_backend='direct'",
    ),
    (
        "page_size mismatch",
        lambda w: HiCacheController(w.allocator, w.host_pool, 4),
        ValueError,
        "page_size=4 must equal",
    ),
    (
        "consumer never produced",
        lambda w: w.controller.layer_done_counter.set_consumer(2),
        ValueError,
        "set_consumer: index must be -1 or a produced slot",
    ),
    ("counter of zero layers", lambda w: LayerDoneCounter(0), ValueError, "num_layers must be"),
    (
        "wait_until bad layer",
        lambda w: w.controller.layer_done_counter.wait_until(9),
        ValueError,
        "wait_until: layer must be in",
    ),
]

RADIX: list[tuple[str, Action, type[Exception], str]] = [
    (
        "unknown eviction policy",
        lambda w: RadixCache(None, w.allocator, PAGE, eviction_policy="random"),
        ValueError,
        "eviction_policy must be one of",
    ),
    (
        "tree page_size mismatch",
        lambda w: RadixCache(None, w.allocator, 4),
        ValueError,
        "page_size=4 differs",
    ),
    ("float token ids", lambda w: w.tree.match_prefix([1.5, 2.0]), TypeError, "token_ids must be"),
    (
        "negative token id",
        lambda w: w.tree.match_prefix([1, -2]),
        ValueError,
        "token_ids must be in",
    ),
    ("string key", lambda w: w.tree.insert("abcd"), TypeError, "token_ids must be a sequence"),
    (
        "unhashable extra_key",
        lambda w: RadixKey([1, 2], extra_key=[1]),
        TypeError,
        "extra_key must be hashable",
    ),
    (
        "value of wrong length",
        lambda w: w.tree.insert([5, 6, 7, 8], idx(12, 13)),
        ValueError,
        "value must be 1-D with one slot per token",
    ),
    (
        "float value",
        lambda w: w.tree.insert([5, 6], torch.tensor([12.0, 13.0])),
        TypeError,
        "value must be an integer tensor",
    ),
    ("evict negative", lambda w: w.tree.evict(-1), ValueError, "num_tokens must be >= 0"),
    (
        "dec_lock_ref unlocked",
        lambda w: w.tree.dec_lock_ref(_sibling(w.locked)),
        ValueError,
        "is not locked",
    ),
    (
        "lock a detached node",
        lambda w: w.tree.inc_lock_ref(TreeNode(w.locked.key, None, None)),
        ValueError,
        "is not in this tree",
    ),
    ("lock a non-node", lambda w: w.tree.inc_lock_ref("root"), TypeError, "node must be a"),
    ("reset while locked", lambda w: w.tree.reset(), ValueError, "locked by live requests"),
    (
        "kv_len past the tokens",
        lambda w: w.tree.cache_finished_req(_req(w, 9)),
        ValueError,
        "req.kv_len must be in",
    ),
]

HiAction = Callable[[HiWorld], Any]


def _hi(w: HiWorld, **kw: Any) -> HiRadixCache:
    """Another cache over the same allocator with ``kw`` overriding valid settings."""
    return HiRadixCache(None, w.cache.token_to_kv_pool_allocator, 1, **kw)


HIRADIX: list[tuple[str, HiAction, type[Exception], str]] = [
    (
        "host of no page",
        lambda w: _hi(w, hicache_ratio=0.0),
        ValueError,
        "must hold at least one page",
    ),
    (
        "ratio as a string",
        lambda w: _hi(w, hicache_ratio="2"),
        TypeError,
        "hicache_ratio must be a number",
    ),
    (
        "unknown write_policy",
        lambda w: _hi(w, write_policy="write_around"),
        ValueError,
        "write_policy must be one of",
    ),
    (
        "layout the backend lacks",
        lambda w: _hi(w, io_backend="direct", mem_layout="page_head"),
        ValueError,
        "mem_layout='page_head' is not supported by io_backend='direct'",
    ),
    (
        "negative load_back_threshold",
        lambda w: _hi(w, load_back_threshold=-1),
        ValueError,
        "load_back_threshold must be >= 0",
    ),
    (
        "unknown eviction_policy",
        lambda w: _hi(w, eviction_policy="newest"),
        ValueError,
        "eviction_policy must be one of",
    ),
    (
        "load back a node not backed up",
        lambda w: w.cache.init_load_back(w.device, 4),
        ValueError,
        "is not backed up",
    ),
    (
        "negative host_hit_length",
        lambda w: w.cache.init_load_back(w.host, -1),
        ValueError,
        "host_hit_length must be >= 0",
    ),
    (
        "negative mem_quota",
        lambda w: w.cache.init_load_back(w.host, 4, mem_quota=-1),
        ValueError,
        "mem_quota must be >= 0",
    ),
    (
        "load back a detached node",
        lambda w: w.cache.init_load_back(TreeNode(w.host.key, None, None), 4),
        ValueError,
        "is not in this tree",
    ),
    (
        "evict_host negative",
        lambda w: w.cache.evict_host(-1),
        ValueError,
        "num_tokens must be >= 0",
    ),
    ("evict a string", lambda w: w.cache.evict("3"), TypeError, "num_tokens must be an int"),
    (
        "unlock a host-only node",
        lambda w: w.cache.dec_lock_ref(w.host),
        ValueError,
        "is not locked",
    ),
    (
        "reset under a request's lock",
        lambda w: w.cache.reset(),
        ValueError,
        "locked by a live request",
    ),
]

CASES = [
    pytest.param(*row[1:], id=f"{group}: {row[0]}")
    for group, rows in (
        ("kernels", KERNELS),
        ("pools", POOLS),
        ("controller", CONTROLLER),
        ("radix", RADIX),
    )
    for row in rows
]
HI_CASES = [pytest.param(*row[1:], id=f"hiradix: {row[0]}") for row in HIRADIX]


@pytest.fixture()
def world() -> World:
    return make_world()


@pytest.mark.parametrize(("action", "error", "message"), CASES)
def test_bad_input_raises_and_changes_nothing(
    world: World, action: Action, error: type[Exception], message: str
) -> None:
    before = snapshot(world)
    with pytest.raises(error, match=message):
        action(world)
    assert_same(before, snapshot(world))
    check_all(world)


@pytest.mark.parametrize(("action", "error", "message"), HI_CASES)
def test_hiradix_bad_input_raises_and_changes_nothing(
    action: HiAction, error: type[Exception], message: str
) -> None:
    world = make_hi_world()
    before = snapshot_hi(world)
    with pytest.raises(error, match=message):
        action(world)
    assert snapshot_hi(world) == before
    world.cache.check_invariants()


def test_catalogue_is_large_enough() -> None:
    assert len(CASES) + len(HI_CASES) >= 20
