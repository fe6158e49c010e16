"""KV events: a router-side replica built only from events equals the tree's tiers."""

from __future__ import annotations

import random

import pytest
import torch

from hicache.radix import HiRadixCache, RadixCache, RadixKey, Req
from hicache.radix.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from hicache.radix.page_hash import namespace_seed
from tests.radix.hiradix_rig import POLICIES, device_pool, fill_kv, make_cache
from tests.radix.test_page_hash import reference_hashes

NAMESPACES = [None, "tenant-a", ("lora", 7)]


class Replica:
    """What a router knows: tier -> page hashes held, and each page's parent hash."""

    def __init__(self) -> None:
        self.tiers: dict[str, set[bytes]] = {"device": set(), "host": set()}
        self.parent: dict[bytes, bytes | None] = {}

    def apply(self, events: list[KVEvent]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                held = self.tiers[event.tier]
                above = event.parent_block_hash
                prior = namespace_seed(event.namespace) if above is None else above
                hashes = reference_hashes(list(event.token_ids), event.block_size, prior)
                assert hashes == list(event.block_hashes)  # tokens, parent and namespace agree
                for h in event.block_hashes:
                    assert h not in held, "a page stored twice in one tier"
                    held.add(h)
                    self.parent[h], above = above, h
            elif isinstance(event, BlockRemoved):
                held = self.tiers[event.tier]
                for h in event.block_hashes:
                    assert h in held, "a page removed that was not stored"
                    held.remove(h)
            else:
                assert isinstance(event, AllBlocksCleared)
                for held in self.tiers.values():
                    held.clear()


def tree_state(cache: RadixCache) -> tuple[dict[str, set[bytes]], dict[bytes, bytes | None]]:
    """The tiers from walking the tree, every hash recomputed token by token from the root."""
    tiers: dict[str, set[bytes]] = {"device": set(), "host": set()}
    parents: dict[bytes, bytes | None] = {}
    stack = [(c, c.key.tolist(), namespace_seed(c.extra_key)) for c in cache.root.children.values()]
    while stack:
        node, ids, seed = stack.pop()
        chain = [None, *reference_hashes(ids, cache.page_size, seed)]
        mine = chain[len(chain) - len(node.key) // cache.page_size :]
        parents.update(zip(mine, chain[len(chain) - len(mine) - 1 : -1], strict=True))
        if node.value is not None:
            tiers["device"].update(mine)
        if node.host_value is not None:
            tiers["host"].update(mine)
        stack.extend((c, ids + c.key.tolist(), seed) for c in node.children.values())
    return tiers, parents


class Player:
    """Seeded random scheduler calls on a HiRadixCache over tiny CPU pools."""

    def __init__(self, cache: HiRadixCache, rng: random.Random) -> None:
        self.cache, self.rng, self.page = cache, rng, cache.page_size
        self.seqs: list[tuple[list[int], object]] = []
        self.alloc = cache.token_to_kv_pool_allocator

    def _seq(self) -> tuple[list[int], object]:
        if self.seqs and self.rng.random() < 0.7:
            base, ns = self.rng.choice(self.seqs)
            base = base[: self.rng.randint(0, len(base))]
        else:
            base, ns = [], self.rng.choice(NAMESPACES)
        seq = base + [self.rng.randrange(6) for _ in range(self.rng.randint(1, 12))]
        return seq, ns

    def _slots(self, n: int) -> torch.Tensor | None:
        if self.alloc.available_size() < n:
            self.cache.evict(n - self.alloc.available_size())
        return self.alloc.alloc(n)

    def put(self) -> None:
        seq, ns = self._seq()
        seq = seq[: len(seq) - len(seq) % self.page]
        slots = self._slots(len(seq)) if seq else None
        if slots is None:
            return
        fill_kv(device_pool(self.cache), slots, seq)
        present = self.cache.insert(RadixKey(seq, ns), slots)
        if present:
            self.alloc.free(slots[:present])
        self.seqs.append((seq, ns))

    def request(self) -> None:
        """A request through match, lock, cache_unfinished_req and cache_finished_req."""
        seq, ns = self._seq()
        cache = self.cache
        match = cache.match_prefix(RadixKey(seq, ns))
        cache.inc_lock_ref(match.last_device_node)
        prefix = len(match.device_indices)
        need = -(-(len(seq) - prefix) // self.page) * self.page
        own = self._slots(need) if need else match.device_indices[:0]
        if own is None:
            cache.dec_lock_ref(match.last_device_node)
            return
        slots = torch.cat([match.device_indices, own])[: len(seq)]
        row = cache.req_to_token_pool.alloc(1)[0]
        cache.req_to_token_pool.write((row, slice(0, len(seq))), slots.to(torch.int32))
        fill_kv(device_pool(cache), slots, seq)
        req = Req(row, seq, kv_len=len(seq), extra_key=ns, prefix_indices=match.device_indices)
        req.last_node, req.cache_protected_len = match.last_device_node, prefix
        cache.cache_unfinished_req(req)
        cache.cache_finished_req(req)
        self.seqs.append((seq, ns))

    def match(self) -> None:
        if self.seqs:
            self.cache.match_prefix(RadixKey(*self.rng.choice(self.seqs)))

    def load(self) -> None:
        if self.seqs:
            self._load(*self.rng.choice(self.seqs))

    def _load(self, seq: list[int], ns: object) -> None:
        m = self.cache.match_prefix(RadixKey(seq, ns))
        if m.host_hit_length:
            self.cache.init_load_back(m.last_host_node, m.host_hit_length)
            self.cache.ready_to_load_host_cache()
            self.cache.check_hicache_events()

    def corrupt(self) -> None:
        """Flip a bit of a host-only node's first page and load it back: the verified load
        drops that node and its subtree from both tiers."""
        host_only = [n for n in self.cache.tree.nodes() if n.value is None]
        if host_only:
            node = self.rng.choice(host_only)
            host = self.cache.cache_controller.mem_pool_host  # layer_first, MHA: [2, L, size, H, D]
            host.kv_buffer[0][0, int(node.host_value[0])][0, 1:2].view(torch.int32).bitwise_xor_(8)
            path = self.cache.tree.path_to_root(node)[::-1]
            self._load([t for n in path for t in n.key.tolist()], node.extra_key)

    def evict(self) -> None:
        self.cache.evict(self.rng.randint(1, 24))

    def evict_host(self) -> None:
        self.cache.evict_host(self.rng.randint(1, 24))

    def events(self) -> None:
        self.cache.check_hicache_events()

    def reset(self) -> None:
        self.cache.drain_transfers()
        self.cache.reset()


OPS = {"put": 5, "request": 3, "match": 2, "load": 4, "corrupt": 1, "evict": 2}
OPS |= {"evict_host": 1, "events": 2, "reset": 0.2}


def play(cache: HiRadixCache, seed: int, steps: int, replica: Replica | None) -> None:
    rng = random.Random(seed)
    player, names, weights = Player(cache, rng), list(OPS), list(OPS.values())
    for _ in range(steps):
        getattr(player, rng.choices(names, weights)[0])()
        cache.check_invariants()
        if replica is not None:
            replica.apply(cache.take_events())
            tiers, parents = tree_state(cache)
            assert replica.tiers == tiers
            assert {h: replica.parent[h] for h in parents} == parents


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("page_size", [1, 2])
@pytest.mark.parametrize("policy", POLICIES)
def test_replica_from_events_equals_the_tree(policy: str, page_size: int, seed: int) -> None:
    cache = make_cache(
        page_size=page_size,
        pages=48 // page_size,
        write_policy=policy,
        hicache_ratio=1.5,
        verify="all",
        enable_kv_events=True,
    )
    replica = Replica()
    play(cache, seed, 200, replica)
    assert cache.integrity_failures > 0  # integrity drops were exercised
    assert any(replica.tiers.values())


def test_events_off_publish_nothing_and_compute_no_hash() -> None:
    cache = make_cache(pages=48, write_policy="write_through", hicache_ratio=1.5, verify="all")
    play(cache, 0, 200, None)
    assert cache.take_events() == []
    assert all(n.hash_value is None for n in cache.tree.nodes())
    assert cache.host_size() > 0  # the workload reached the host tier


def test_sglang_name_turns_events_on_and_bad_flags_are_refused() -> None:
    cache = RadixCache(None, None, 1, enable_kv_cache_events=True)
    cache.insert(RadixKey([1, 2], "t"))
    first, second = reference_hashes([1, 2], 1, namespace_seed("t"))
    assert cache.take_events() == [  # one event per page, each naming its parent page
        BlockStored((first,), None, (1,), 1, "GPU", "t"),
        BlockStored((second,), first, (2,), 1, "GPU", "t"),
    ]
    assert cache.take_events() == []
    with pytest.raises(TypeError, match="enable_kv_events"):
        RadixCache(None, None, 1, enable_kv_events=1)  # type: ignore[arg-type]


def test_device_only_cache_reports_eviction_and_reset() -> None:
    cache = RadixCache(None, None, 1, enable_kv_events=True)
    cache.insert(RadixKey([1, 2, 3]))
    cache.insert(RadixKey([1, 2, 4]))  # splits: no event for the pages already stored
    stored = cache.take_events()
    assert [e.token_ids for e in stored] == [(1,), (2,), (3,), (4,)]  # type: ignore[union-attr]
    cache.evict(1)
    (removed,) = cache.take_events()
    assert isinstance(removed, BlockRemoved) and removed.tier == "device"
    cache.reset()
    assert cache.take_events() == [AllBlocksCleared()]
