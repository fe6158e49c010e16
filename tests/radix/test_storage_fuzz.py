"""A seeded random walk over one HiRadixCache with a storage tier: inserts, device and host
evictions, prefetches under every policy (some aborted), load-backs, drains and resets, over a
reliable and a flaky backend. After every step the invariants hold (no host slot leaked or
reserved by a finished prefetch), and every prefix matched on the device holds exactly the KV
its tokens were given: pages that went device -> host -> storage -> host -> device included."""

from __future__ import annotations

import random
import time

import pytest
import torch

from hicache.backends.memory import MemoryStorage
from hicache.radix import RadixKey
from tests.radix.storage_helpers import PAGE, make_stack, storage_config

BASES = [[b * 1000 + i for i in range(48)] for b in range(1, 5)]


class FlakyStorage(MemoryStorage):
    """Fails about one call in four, raising or returning misses."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.rng = random.Random(seed)

    def _flake(self) -> None:
        if self.rng.random() < 0.12:
            raise OSError("flaky storage")

    def batch_exists(self, keys, extra_info=None):
        self._flake()
        return super().batch_exists(keys, extra_info)

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        self._flake()
        done = super().batch_get_v1(keys, host_indices, extra_info)
        return [ok and self.rng.random() > 0.1 for ok in done]

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        self._flake()
        return super().batch_set_v1(keys, host_indices, extra_info)


def oracle(ids: list[int], pos: int, layer: int) -> float:
    """The KV value of token ``pos`` of prefix ``ids`` (depends on the whole prefix)."""
    return float(hash((tuple(ids[: pos + 1]), layer)) % 9973) + 0.5


class Walk:
    def __init__(self, seed: int, backend: MemoryStorage, policy: str) -> None:
        self.rng = random.Random(seed)
        cfg = storage_config(backend, prefetch_policy=policy, prefetch_timeout_base=0.002,
                             prefetch_timeout_per_ki_token=0.0)  # fmt: skip
        self.stack = make_stack(cfg, size=96, ratio=2.0)
        self.cache = self.stack.cache
        self.pending: set[str] = set()
        self.next_id = 0

    def prompt(self) -> list[int]:
        base = self.rng.choice(BASES)
        return base[: self.rng.randrange(PAGE, len(base) + 1, PAGE)]

    def fill(self, ids: list[int], start: int, slots: torch.Tensor) -> None:
        for layer_i, (k, v) in enumerate(zip(*self.stack.kv_pool.part_buffers, strict=True)):
            values = [oracle(ids, p, layer_i) for p in range(start, start + len(slots))]
            col = torch.tensor(values).view(-1, 1, 1)
            k[slots] = col.expand(-1, *k.shape[1:])
            v[slots] = -col.expand(-1, *v.shape[1:])

    def insert(self) -> None:
        ids = self.prompt()
        m = self.cache.match_prefix(RadixKey(ids))
        need = len(ids) - len(m.device_indices)
        if need == 0:
            return
        alloc = self.stack.allocator
        if alloc.available_size() < need:
            self.cache.evict(need)
        slots = alloc.alloc(need)
        if slots is None:
            return
        self.fill(ids, len(m.device_indices), slots)
        self.cache.insert(RadixKey(ids), torch.cat([m.device_indices, slots]))

    def prefetch(self) -> None:
        ids = self.prompt()
        m = self.cache.match_prefix(RadixKey(ids))
        hit = len(m.device_indices) + m.host_hit_length
        rid = f"r{self.next_id}"
        self.next_id += 1
        if self.cache.prefetch_from_storage(rid, m.last_host_node, RadixKey(ids[hit:])):
            self.pending.add(rid)

    def progress(self) -> None:
        for rid in list(self.pending):
            if self.rng.random() < 0.2:
                self.cache.release_aborted_request(rid)
                self.pending.discard(rid)
            elif self.cache.check_prefetch_progress(rid):
                self.cache.pop_prefetch_loaded_tokens(rid)
                self.pending.discard(rid)

    def load_and_verify(self) -> None:
        ids = self.prompt()
        cache = self.cache
        m = cache.match_prefix(RadixKey(ids))
        cache.inc_lock_ref(m.last_device_node)
        loaded, node = cache.init_load_back(m.last_host_node, m.host_hit_length)
        cache.consume_load_batch(cache.ready_to_load_host_cache())
        cache.drain_transfers()
        slots = torch.cat([m.device_indices, loaded])
        for layer_i, (k, v) in enumerate(zip(*self.stack.kv_pool.part_buffers, strict=True)):
            want = torch.tensor([oracle(ids, p, layer_i) for p in range(len(slots))])
            assert torch.equal(k[slots][:, 0, 0], want), f"layer {layer_i} K differs"
            assert torch.equal(v[slots][:, 0, 0], -want), f"layer {layer_i} V differs"
        cache.dec_lock_ref(m.last_device_node)
        if len(loaded):
            cache.inc_lock_ref(node)  # the loaded chain: lock and release it like a request
            cache.dec_lock_ref(node)

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.3:
            self.insert()
        elif r < 0.4:
            self.cache.evict(self.rng.randrange(1, 64))
        elif r < 0.5:
            self.cache.evict_host(self.rng.randrange(1, 96))
        elif r < 0.65:
            self.prefetch()
        elif r < 0.8:
            self.progress()
        elif r < 0.93:
            if not self.pending:
                self.load_and_verify()
        elif r < 0.98:
            self.cache.drain_transfers()
        elif not self.pending:
            self.cache.reset()
        self.cache.check_hicache_events()
        self.cache.check_invariants()


@pytest.mark.parametrize("policy", ["wait_complete", "timeout", "best_effort"])
@pytest.mark.parametrize("flaky", [False, True])
def test_random_walk_keeps_every_byte(policy: str, flaky: bool) -> None:
    seed = ["wait_complete", "timeout", "best_effort"].index(policy) * 2 + flaky
    backend = FlakyStorage(seed) if flaky else MemoryStorage()
    walk = Walk(seed, backend, policy)
    for _ in range(400):
        walk.step()
    deadline = time.monotonic() + 10
    while walk.pending:
        walk.progress()
        assert time.monotonic() < deadline
    walk.cache.drain_transfers()
    walk.cache.check_invariants()
    assert walk.cache.host_tier.reserved() == 0
    stats = walk.cache.stats().storage
    assert stats.pending_prefetches == 0 and stats.pending_backups == 0
    assert stats.prefetches > 0
    assert stats.prefetch_loaded_tokens > 0  # the walk did take pages back from storage
    walk.cache.close()
