"""Embed hicache in a scheduler loop: a runnable example on CPU (about a second).

    python examples/embed.py

Four chat turns share a 128-token system prompt; the device pool holds 256 tokens, so the
third user's turn pushes the first user's history to the host tier, and the first user's next
turn loads it back instead of recomputing it. A real engine runs attention where ``forward``
writes random KV; ``hicache/engine/engine.py`` is the complete loop (chunked prefill, decode,
batching, eviction when short).
"""

from __future__ import annotations

import torch

from hicache import HiCacheConfig, KVStack, RadixKey, Req, build_kv_stack

PAGE = 16  # every length below is a whole number of pages


def forward(stack: KVStack, slots: torch.Tensor) -> None:
    """Stand-in for the model: write KV for ``slots`` in every layer."""
    pool = stack.kv_pool
    for layer in range(pool.layer_num):
        k, v = (torch.randn(len(slots), pool.head_num, pool.head_dim) for _ in range(2))
        pool.set_kv_buffer(layer, slots, k.to(pool.dtype), v.to(pool.dtype))


def serve(stack: KVStack, prompt: list[int], tenant: str) -> dict[str, int]:
    """Prefill one request with whatever the cache holds; returns where its tokens came from."""
    cache, rows = stack.cache, stack.req_to_token_pool
    cache.check_hicache_events()  # every iteration: acks of finished backups and loads
    free = rows.alloc(1)
    assert free is not None, "a free request row"
    row = free[0]
    req = Req(row, prompt, extra_key=tenant)
    m = cache.match_prefix(RadixKey(req.tokens, extra_key=tenant))  # a view, nothing copied
    node, prefix = m.last_device_node, m.device_indices
    cache.inc_lock_ref(node)  # lock before the slots are used
    if m.host_hit_length:  # on the host only: load it back into fresh device slots
        loaded, deeper = cache.init_load_back(m.last_host_node, m.host_hit_length)
        if len(loaded):
            cache.inc_lock_ref(deeper)
            cache.dec_lock_ref(node)
            node, prefix = deeper, torch.cat([prefix, loaded])
    new = len(prompt) - len(prefix)
    short = new - stack.allocator.available_size()
    if short > 0:
        cache.evict(short)  # LRU entries go to the host (write-through keeps a copy there)
    slots = stack.allocator.alloc(new)
    assert slots is not None, "the device pool holds one request"
    rows.write((row, slice(0, len(prompt))), torch.cat([prefix, slots]).to(torch.int32))
    cache.consume_load_batch(cache.ready_to_load_host_cache())  # this pass reads the loads
    forward(stack, slots)
    req.prefix_indices, req.last_node = prefix, node
    req.kv_len, req.cache_protected_len = len(prompt), len(prefix)
    cache.cache_finished_req(req)  # insert the new tokens, unlock, free the row
    device = len(m.device_indices)
    return {"device": device, "host": len(prefix) - device, "computed": new}


def main() -> None:
    stack = build_kv_stack(
        layer_num=2,
        head_num=2,
        head_dim=8,
        dtype=torch.float16,
        device="cpu",  # "cuda" on a GPU: the same calls
        size=256,
        page_size=PAGE,
        max_requests=4,
        max_context_len=512,
        hicache=HiCacheConfig(hicache_ratio=4.0),  # None: a device-only RadixCache
    )
    system = list(range(1, 129))
    history = {user: system + [1000 * user + i for i in range(64)] for user in (1, 2, 3)}
    turns = [1, 2, 3, 1]  # user 1 comes back after users 2 and 3 filled the device pool
    for turn, user in enumerate(turns):
        if turn == 3:
            history[user] += [5000 + i for i in range(32)]
        got = serve(stack, history[user], tenant="demo")
        print(f"turn {turn + 1} (user {user}, {len(history[user])} tokens): {got}")
    stack.cache.check_invariants()


if __name__ == "__main__":
    main()
