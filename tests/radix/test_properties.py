"""Property tests: RadixCache against a naive model, and a randomized serving loop.

The model of the tree is the set of cached page-prefixes ``(extra_key, *ids)`` with the slots of
each prefix's last page: a match is the longest page-aligned prefix in that set.
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from hicache.radix import EVICTION_POLICIES, RadixCache, RadixKey

from .engine import MiniEngine
from .fakes import FakeAllocator, check_accounting, tree_prefixes

SETTINGS = settings(
    max_examples=75,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
seqs = st.lists(st.integers(0, 3), max_size=10)
namespaces = st.sampled_from([None, "x"])
policies = st.sampled_from(sorted(EVICTION_POLICIES))


def page_prefixes(ns, ids, page: int) -> list[tuple]:
    return [(ns, *ids[:end]) for end in range(page, len(ids) - len(ids) % page + 1, page)]


class TreeVsModel(RuleBasedStateMachine):
    @initialize(page=st.integers(1, 3), policy=policies, with_allocator=st.booleans())
    def setup(self, page, policy, with_allocator):
        self.page = page
        self.allocator = FakeAllocator(60 * page, page) if with_allocator else None
        self.cache = RadixCache(None, self.allocator, page, eviction_policy=policy)
        self.model: dict[tuple, tuple[int, ...]] = {}
        self.locks: list[tuple] = []  # (node, token prefix it protects)

    def _known(self, ns, ids) -> list[tuple]:
        known = []
        for prefix in page_prefixes(ns, ids, self.page):
            if prefix not in self.model:
                break
            known.append(prefix)
        return known

    def _slots_for(self, n: int) -> torch.Tensor | None:
        if self.allocator is None:
            return None
        need = -(-n // self.page) * self.page
        if self.allocator.available_size() < need:
            self.cache.evict(need - self.allocator.available_size())
            self.model = tree_prefixes(self.cache)
        return self.allocator.alloc(need)

    @rule(ids=seqs, ns=namespaces)
    def insert(self, ids, ns):
        slots = self._slots_for(len(ids))
        if self.allocator is not None and slots is None:
            return
        value = None if slots is None else slots[: len(ids)]
        known = self._known(ns, ids)
        present = self.cache.insert(RadixKey(ids, ns), value)
        assert present == len(known) * self.page
        stored = ids if value is None else value.tolist()
        for prefix in page_prefixes(ns, ids, self.page)[len(known) :]:
            end = len(prefix) - 1
            self.model[prefix] = tuple(stored[end - self.page : end])
        if slots is not None:  # the caller frees duplicates and the unaligned tail
            aligned = len(ids) - len(ids) % self.page
            spare = torch.cat([slots[:present], slots[aligned:]])
            if spare.numel():
                self.allocator.free(spare)

    @rule(ids=seqs, ns=namespaces)
    def match(self, ids, ns):
        known = self._known(ns, ids)
        result = self.cache.match_prefix(RadixKey(ids, ns))
        expected = [s for prefix in known for s in self.model[prefix]]
        assert result.device_indices.tolist() == expected
        assert result.last_host_node is result.last_device_node and result.host_hit_length == 0
        node, depth = result.last_device_node, 0
        while node is not self.cache.root:
            depth += len(node.key)
            assert node.extra_key == ns
            node = node.parent
        assert depth == len(expected)

    @rule(n=st.integers(0, 12))
    def evict(self, n):
        before, evictable = dict(self.model), self.cache.evictable_size()
        got = self.cache.evict(n)
        after = tree_prefixes(self.cache)
        assert all(before[k] == v for k, v in after.items())
        assert got == (len(before) - len(after)) * self.page
        assert got >= n if evictable >= n else got == evictable
        self.model = after

    @rule(ids=seqs, ns=namespaces)
    def lock(self, ids, ns):
        result = self.cache.match_prefix(RadixKey(ids, ns))
        if result.last_device_node is not self.cache.root:
            self.cache.inc_lock_ref(result.last_device_node)
            self.locks.append((result.last_device_node, (ns, *ids[: len(result.device_indices)])))

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 100))
    def unlock(self, i):
        node, _ = self.locks.pop(i % len(self.locks))
        self.cache.dec_lock_ref(node)

    @invariant()
    def consistent(self):
        self.cache.check_invariants()
        assert tree_prefixes(self.cache) == self.model
        assert all(len(k) - 1 == self.page or k[: -self.page] in self.model for k in self.model), (
            "cached prefixes must be prefix-closed"
        )
        protected = {p for _, (ns, *ids) in self.locks for p in page_prefixes(ns, ids, self.page)}
        assert protected <= self.model.keys(), "a locked prefix was evicted"
        assert self.cache.protected_size() == len(protected) * self.page
        assert self.cache.total_size() == len(self.model) * self.page
        if self.allocator is not None:
            check_accounting(self.cache, self.allocator, torch.zeros(0, 0), [])


class ServingLoop(RuleBasedStateMachine):
    @initialize(page=st.integers(1, 3), policy=policies)
    def setup(self, page, policy):
        self.eng = MiniEngine(page, slots=40 * page, rows=6, context=32, eviction_policy=policy)

    @rule(ids=seqs.filter(len), ns=namespaces, frac=st.floats(0.3, 1.0))
    def admit(self, ids, ns, frac):
        self.eng.admit(ids, ns, kv_len=max(1, int(len(ids) * frac)))

    @precondition(lambda self: self.eng.live)
    @rule(i=st.integers(0, 100), token=st.integers(0, 3))
    def decode(self, i, token):
        req = self.eng.live[i % len(self.eng.live)]
        if req.kv_len < len(req.origin_input_ids):
            self.eng.compute(req, len(req.origin_input_ids))
        elif len(req.origin_input_ids) + len(req.output_ids) < 30:
            self.eng.decode(req, token)

    @precondition(lambda self: self.eng.live)
    @rule(i=st.integers(0, 100))
    def unfinished(self, i):
        self.eng.cache.cache_unfinished_req(self.eng.live[i % len(self.eng.live)])

    @precondition(lambda self: self.eng.live)
    @rule(i=st.integers(0, 100))
    def finish(self, i):
        req = self.eng.live[i % len(self.eng.live)]
        aligned = req.kv_len - req.kv_len % self.eng.page_size
        ids = (req.origin_input_ids + req.output_ids)[:aligned]
        self.eng.finish(req)
        got = self.eng.cache.match_prefix(RadixKey(ids, req.extra_key)).device_indices
        assert len(got) == aligned, "a finished request's pages must be cached"

    @rule(n=st.integers(0, 20))
    def evict(self, n):
        self.eng.cache.evict(n)

    @invariant()
    def accounted(self):
        self.eng.check()
        locked = sum(1 for r in self.eng.live if r.cache_protected_len)
        assert self.eng.cache.protected_size() >= (self.eng.page_size if locked else 0)


TestTreeVsModel = TreeVsModel.TestCase
TestTreeVsModel.settings = SETTINGS
TestServingLoop = ServingLoop.TestCase
TestServingLoop.settings = SETTINGS
