"""Real pools under a HiRadixCache, and KV bytes derived from (token, position, layer).

Every element of every token's K/V (or MLA latent) gets a distinct float32 value built from its
token id, position, layer, head and channel, so any misplaced or stale byte reads back wrong.
"""

from __future__ import annotations

from typing import Any

import torch

from hicache.pools import (
    MHATokenToKVPool,
    MLATokenToKVPool,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from hicache.radix import HiRadixCache, RadixKey
from hicache.radix.invariants import iter_nodes

LAYERS = 2
HEADS, DIM = 2, 4
POLICIES = ["write_through", "write_through_selective", "write_back"]


def make_cache(
    kind: str = "mha",
    io_backend: str = "kernel",
    layout: str = "layer_first",
    page_size: int = 1,
    pages: int = 16,
    *,
    device: str = "cpu",
    **kwargs: Any,
) -> HiRadixCache:
    """A HiRadixCache over a device pool of ``pages`` pages (float32) and a request table."""
    size = pages * page_size
    if kind == "mha":
        pool: Any = MHATokenToKVPool(size, page_size, torch.float32, HEADS, DIM, LAYERS, device)
    else:
        pool = MLATokenToKVPool(size, page_size, torch.float32, DIM, 2, LAYERS, device)
    allocator = TokenToKVPoolAllocator(size, page_size, device, kvcache=pool)
    req_pool = ReqToTokenPool(4, 4 * size, device)
    kwargs.setdefault("load_back_threshold", 1)
    return HiRadixCache(
        req_pool, allocator, page_size, io_backend=io_backend, mem_layout=layout, **kwargs
    )


def device_pool(cache: HiRadixCache) -> Any:
    return cache.cache_controller.mem_pool_device


def _pattern(
    pool: Any, tokens: torch.Tensor, positions: torch.Tensor, layer: int, part: int
) -> torch.Tensor:
    """``[n, heads, dim]`` float32 of distinct integers (exact in float32, < 2**24)."""
    heads = pool.head_num
    dim = pool.kv_dim if isinstance(pool, MLATokenToKVPool) else pool.head_dim
    base = ((tokens * 512 + positions) * LAYERS + layer) * 2 + part  # [n]
    lane = torch.arange(heads * dim).view(1, heads, dim)
    return (base.view(-1, 1, 1) * heads * dim + lane).to(torch.float32).to(pool.device)


def fill_kv(pool: Any, slots: torch.Tensor, tokens: list[int], start: int = 0) -> None:
    """Write the KV of ``tokens`` at positions ``start ..`` into ``slots`` (every layer)."""
    tok = torch.tensor(tokens, dtype=torch.int64)
    pos = torch.arange(start, start + len(tokens))
    for layer in range(LAYERS):
        if isinstance(pool, MLATokenToKVPool):
            pool.set_kv_buffer(layer, slots, _pattern(pool, tok, pos, layer, 0))
        else:
            pool.set_kv_buffer(
                layer, slots, _pattern(pool, tok, pos, layer, 0), _pattern(pool, tok, pos, layer, 1)
            )


def assert_kv(pool: Any, slots: torch.Tensor, tokens: list[int], start: int = 0) -> None:
    """The KV read through ``get_key_buffer``/``get_value_buffer`` at ``slots`` is ``tokens``'."""
    tok = torch.tensor(tokens, dtype=torch.int64)
    pos = torch.arange(start, start + len(tokens))
    for layer in range(LAYERS):
        keys = pool.get_key_buffer(layer)[slots]
        values = pool.get_value_buffer(layer)[slots]
        if isinstance(pool, MLATokenToKVPool):
            want_k = _pattern(pool, tok, pos, layer, 0)
            want_v = want_k[..., : pool.kv_lora_rank]
        else:
            want_k, want_v = (_pattern(pool, tok, pos, layer, p) for p in (0, 1))
        assert torch.equal(keys, want_k), f"layer {layer}: keys differ"
        assert torch.equal(values, want_v), f"layer {layer}: values differ"


def scramble_free(cache: HiRadixCache) -> None:
    """Overwrite every free device slot with garbage, so a load that did not happen shows."""
    allocator = cache.token_to_kv_pool_allocator
    free = allocator.free_slots().to(device_pool(cache).device)
    if free.numel():
        fill_kv(device_pool(cache), free, [450] * free.numel(), start=0)


def put(cache: HiRadixCache, tokens: list[int], extra_key: Any = None) -> torch.Tensor:
    """Allocate, fill and insert ``tokens`` (whole pages); returns the slots given to the tree."""
    slots = cache.token_to_kv_pool_allocator.alloc(len(tokens))
    assert slots is not None, "device pool full"
    fill_kv(device_pool(cache), slots, tokens)
    present = cache.insert(RadixKey(tokens, extra_key), slots)
    if present:
        cache.token_to_kv_pool_allocator.free(slots[:present])
    cache.check_invariants()
    return slots


def load_all(cache: HiRadixCache, tokens: list[int], extra_key: Any = None) -> torch.Tensor:
    """Match ``tokens``, load back any host part, process events; the full device prefix."""
    m = cache.match_prefix(RadixKey(tokens, extra_key))
    cache.check_invariants()
    prefix = m.device_indices
    if m.host_hit_length:
        loaded, node = cache.init_load_back(m.last_host_node, m.host_hit_length)
        cache.check_invariants()
        assert node is m.last_host_node and len(loaded) == m.host_hit_length
        assert cache.ready_to_load_host_cache() >= 0
        cache.check_hicache_events()
        cache.check_invariants()
        prefix = torch.cat([prefix, loaded])
    return prefix


def host_accounted(cache: HiRadixCache) -> bool:
    """Host slots free + host slots in the tree == host pool size."""
    host = cache.cache_controller.mem_pool_host
    return host.available_size() + cache.host_size() == host.size


def tokens_of(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 400, (n,), generator=gen).tolist()


def snapshot(cache: HiRadixCache) -> tuple:
    """Everything observable about both tiers, to assert a failed call changed nothing."""
    nodes = sorted(
        (
            n.id,
            n.lock_ref,
            n.hit_count,
            n.last_access_time,
            tuple(n.key.tolist()),
            None if n.value is None else tuple(n.value.tolist()),
            None if n.host_value is None else tuple(n.host_value.tolist()),
        )
        for n in iter_nodes(cache)
    )
    sizes = (cache.evictable_size(), cache.protected_size(), cache.host_size())
    free = (
        cache.token_to_kv_pool_allocator.free_slots().tolist(),
        cache.cache_controller.mem_pool_host.free_slots().tolist(),
    )
    return nodes, sizes, free
