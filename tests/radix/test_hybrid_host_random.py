"""Random operation sequences on a hybrid tree over the host tier keep every invariant, conserve
every pool, and never serve a wrong byte: each token's KV (SWA KV inside the window) and the
restored state are those its prefix was inserted with."""

from __future__ import annotations

import zlib

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hicache.radix import RadixKey
from tests.radix.hybrid_host_rig import HybridHostRig

PREFIXES = [[1] * 8 + [2] * 8, [1] * 8 + [3] * 8, [4] * 16]
WINDOW = 4

PUT = st.tuples(st.just("put"), st.integers(0, 2), st.integers(1, 4))
SERVE = st.tuples(st.just("serve"), st.integers(0, 2), st.integers(1, 4))
SPILL = st.tuples(st.just("spill"), st.just(0), st.just(0))
OPS = st.one_of(  # puts, serves and spills weighted up: host hits need all three
    PUT,
    PUT,
    SERVE,
    SERVE,
    SPILL,
    st.tuples(st.just("unlock"), st.integers(0, 9), st.just(0)),
    st.tuples(st.just("evict_swa"), st.integers(0, 24), st.just(0)),
    st.tuples(st.just("evict_states"), st.integers(0, 3), st.just(0)),
    st.tuples(st.just("evict"), st.integers(0, 24), st.just(0)),
    st.tuples(st.just("evict_host"), st.integers(0, 24), st.just(0)),
    st.tuples(st.just("check_hicache_events"), st.just(0), st.just(0)),
)


def code(ids: list[int]) -> float:
    """The value a prefix's last token's KV (and the state after it) is written with."""
    return float(zlib.crc32(bytes(ids)) % 100_000 + 1)


def serve(rig: HybridHostRig, ids: list[int]):
    """Match, load back the host part, let it land, lock the prefix and check its bytes."""
    cache = rig.cache
    match = cache.match_prefix(RadixKey(ids))
    slots, node = match.device_indices, match.last_device_node
    state = match.state_slot
    if match.host_hit_length:
        loaded, last = cache.init_load_back(match.last_host_node, match.host_hit_length)
        if loaded.numel():
            slots, node = torch.cat([slots, loaded.to(slots.device)]), last
            state = cache.device_state(node)
    cache.consume_load_batch(cache.ready_to_load_host_cache())
    cache.drain_transfers()
    cache.inc_lock_ref(node)
    n = len(slots)
    for layer in rig.attention_layers():
        first = max(0, n - WINDOW) if rig.pattern[layer] == "S" else 0
        got = rig.read_keys(layer, slots[first:])[:, 0, 0].tolist()
        assert got == [code(ids[: i + 1]) + layer for i in range(first, n)], (layer, first, n)
    if "L" in rig.pattern and n:
        assert state is not None and rig.state_value(state) == code(ids[:n])
    return node


def run(rig: HybridHostRig, ops: list[tuple[str, int, int]]) -> None:
    cache, locked = rig.cache, []
    for op, a, b in ops:
        if op in ("put", "serve"):
            ids = PREFIXES[a][: b * 4]
            if op == "serve":
                locked.append(serve(rig, ids))
            elif rig.pools.allocator.available_size() >= 16 and rig.has_state_room():
                rig.put(ids, [code(ids[: i + 1]) for i in range(len(ids))])
        elif op == "spill":  # every unlocked device leaf to the host
            cache.drain_transfers()
            cache.evict(cache.evictable_size())
        elif op == "unlock":
            if locked:
                cache.dec_lock_ref(locked.pop(a % len(locked)))
        else:
            getattr(cache, op)(*([a] if op != "check_hicache_events" else []))
        rig.check()
    for node in locked:
        cache.dec_lock_ref(node)
    cache.reset()
    assert rig.state_pool is None or rig.state_pool.available_size() == rig.state_pool.size
    assert rig.pools.allocator.available_size() == rig.pools.allocator.size


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(OPS, min_size=12, max_size=30),
    st.sampled_from(["FSL", "FL", "FS"]),
    st.sampled_from([1, 4]),
    st.sampled_from(["write_through", "write_back", "write_through_selective"]),
)
def test_random_sequences_keep_the_invariants_and_the_bytes(ops, pattern, page, policy) -> None:
    rig = HybridHostRig(
        pattern,
        window=WINDOW,
        page_size=page,
        pages=64 // page * 2 if page == 1 else 16,
        write_policy=policy,
        load_back_threshold=0,
        hicache_ratio=1.5,
    )
    run(rig, ops)
