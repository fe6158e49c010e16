"""Embed hicache in a scheduler loop: a runnable example on CPU (about a second).

    python examples/embed.py

Four chat turns share a 128-token system prompt; the device pool holds 256 tokens, so the
third user's turn pushes the first user's history to the host tier, and the first user's next
turn loads it back instead of recomputing it. Every page also goes to a file store (the storage
tier, L3): a fresh instance (empty device and host tiers, as after a restart) then serves the
first user's next turn from storage. A real engine runs attention where ``forward`` writes
random KV; ``hicache/engine/engine.py`` is the complete loop (chunked prefill, decode,
batching, eviction when short, other requests running while one waits on storage).
"""

from __future__ import annotations

import tempfile
import time

import torch

from hicache import HiCacheConfig, KVStack, RadixKey, Req, StorageConfig, build_kv_stack

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
    key = RadixKey(req.tokens, extra_key=tenant)  # a view of the request's tokens, no copy
    m = cache.match_prefix(key)
    hit, rid = len(m.device_indices) + m.host_hit_length, f"row{row}"
    stored = 0
    if cache.prefetch_from_storage(rid, m.last_host_node, RadixKey(prompt[hit:], tenant)):
        while not cache.check_prefetch_progress(rid):  # a scheduler serves others meanwhile
            time.sleep(0.001)
        stored = cache.pop_prefetch_loaded_tokens(rid)
        m = cache.match_prefix(key)  # the pages from storage are host-only nodes now
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
    start = time.perf_counter()
    forward(stack, slots)
    cache.note_prefill(new, time.perf_counter() - start)  # load-or-recompute uses it
    req.prefix_indices, req.last_node = prefix, node
    req.kv_len, req.cache_protected_len = len(prompt), len(prefix)
    cache.cache_finished_req(req)  # insert the new tokens, unlock, free the row
    device = len(m.device_indices)
    host = len(prefix) - device - stored
    return {"device": device, "host": host, "storage": stored, "computed": new}


def instance(store: str) -> KVStack:
    """A cache over its own device and host pools and the shared file store ``store``."""
    storage = StorageConfig(
        backend="file",  # or "mooncake": Mooncake Store, shared across machines
        extra_config={"root": store},
        model_id="demo-model",  # with the revision, part of every page's key
        model_revision="r1",
        prefetch_threshold=PAGE,  # SGLang's default is 256 tokens
    )
    return build_kv_stack(
        layer_num=2,
        head_num=2,
        head_dim=8,
        dtype=torch.float16,
        device="cpu",  # "cuda" on a GPU: the same calls
        size=256,
        page_size=PAGE,
        max_requests=4,
        max_context_len=512,
        hicache=HiCacheConfig(hicache_ratio=4.0, storage=storage),  # None: device only
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as store:
        run(store)


def run(store: str) -> None:
    stack = instance(store)
    system = list(range(1, 129))
    history = {user: system + [1000 * user + i for i in range(64)] for user in (1, 2, 3)}
    turns = [1, 2, 3, 1]  # user 1 comes back after users 2 and 3 filled the device pool
    for turn, user in enumerate(turns):
        if turn == 3:
            history[user] += [5000 + i for i in range(32)]
        got = serve(stack, history[user], tenant="demo")
        print(f"turn {turn + 1} (user {user}, {len(history[user])} tokens): {got}")
    stack.cache.check_invariants()
    stack.cache.drain_transfers()  # the last pages reach storage
    stack.cache.close()
    fresh = instance(store)  # a restart: empty device and host tiers, the same store
    history[1] += [6000 + i for i in range(16)]
    got = serve(fresh, history[1], tenant="demo")
    print(f"turn 5 (user 1, new instance, {len(history[1])} tokens): {got}")
    fresh.cache.check_invariants()
    fresh.cache.close()


if __name__ == "__main__":
    main()
