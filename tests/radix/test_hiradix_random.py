"""Seeded random operation sequences: invariants of both tiers and every device byte after each."""

from __future__ import annotations

import random

import numpy as np
import pytest

from hicache.radix import HiRadixCache, RadixKey
from tests.radix.hiradix_rig import (
    POLICIES,
    assert_kv,
    device_pool,
    fill_kv,
    host_accounted,
    load_all,
    make_cache,
)


def sweep(cache: HiRadixCache) -> None:
    """Every device copy in the tree holds the KV of its tokens at their positions."""
    stack = [(child, child.key) for child in cache.root.children.values()]
    while stack:
        node, ids = stack.pop()
        if node.value is not None:
            assert_kv(device_pool(cache), node.value, node.key.tolist(), len(ids) - len(node.key))
        stack.extend((c, np.concatenate([ids, c.key])) for c in node.children.values())


class Player:
    def __init__(self, cache: HiRadixCache, rng: random.Random) -> None:
        self.cache, self.rng, self.page = cache, rng, cache.page_size
        self.seqs: list[list[int]] = []
        self.locks: list = []

    def put(self) -> None:
        base = self.rng.choice(self.seqs)[: self.rng.randint(0, 24)] if self.seqs else []
        seq = base + [self.rng.randrange(50) for _ in range(self.rng.randint(1, 16))]
        seq = seq[: len(seq) - len(seq) % self.page]
        if not seq:
            return
        alloc = self.cache.token_to_kv_pool_allocator
        if alloc.available_size() < len(seq):
            self.cache.evict(len(seq) - alloc.available_size())
        slots = alloc.alloc(len(seq))
        if slots is None:
            return
        fill_kv(device_pool(self.cache), slots, seq)
        present = self.cache.insert(RadixKey(seq), slots)
        if present:
            alloc.free(slots[:present])
        self.seqs.append(seq)

    def load(self) -> None:
        if self.seqs:
            seq = self.rng.choice(self.seqs)
            prefix = load_all(self.cache, seq)
            assert_kv(device_pool(self.cache), prefix, seq[: len(prefix)])

    def lock(self) -> None:
        if self.seqs:
            node = self.cache.match_prefix(RadixKey(self.rng.choice(self.seqs))).last_device_node
            self.cache.inc_lock_ref(node)
            self.locks.append(node)

    def unlock(self) -> None:
        if self.locks:
            self.cache.dec_lock_ref(self.locks.pop(self.rng.randrange(len(self.locks))))

    def evict(self) -> None:
        self.cache.evict(self.rng.randint(1, 24))

    def evict_host(self) -> None:
        self.cache.evict_host(self.rng.randint(1, 24))

    def events(self) -> None:
        self.cache.check_hicache_events()

    def reset(self) -> None:
        while self.locks:
            self.cache.dec_lock_ref(self.locks.pop())
        self.cache.reset()
        alloc = self.cache.token_to_kv_pool_allocator
        assert alloc.available_size() == alloc.size and self.cache.host_size() == 0


OPS = {
    "put": 6,
    "load": 4,
    "lock": 1,
    "unlock": 1,
    "evict": 2,
    "evict_host": 1,
    "events": 2,
    "reset": 0.1,
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    ("kind", "io_backend", "layout", "page_size"),
    [
        ("mha", "kernel", "page_head", 1),
        ("mla", "direct", "page_first_direct", 4),
    ],
)
@pytest.mark.parametrize("policy", POLICIES)
def test_random_operations_keep_both_tiers_consistent(
    policy: str, kind: str, io_backend: str, layout: str, page_size: int, seed: int
) -> None:
    cache = make_cache(
        kind,
        io_backend,
        layout,
        page_size,
        pages=48 // page_size,
        write_policy=policy,
        hicache_ratio=1.5,
    )
    rng = random.Random(seed)
    player = Player(cache, rng)
    names, weights = list(OPS), list(OPS.values())
    for _ in range(150):
        getattr(player, rng.choices(names, weights)[0])()
        cache.check_invariants()
        assert host_accounted(cache)
        sweep(cache)
