"""Random valid and invalid calls on a real-pool cache: every invalid one raises, changing nothing.

A hypothesis state machine drives a ``RadixCache`` and a ``HiRadixCache`` (page sizes 1 and 4,
every write policy, tiny CPU pools) through the serving protocol of ``hicache.radix.req`` and
interleaves misuse: finishing a request twice, bad request rows, ``insert`` with slots the caller
does not own, lock misuse, bad keys, bad ``extra_key`` values and bad eviction counts. Each
misuse rule tries every case of its class in the current state; each case must raise
``TypeError``/``ValueError``/``IndexError`` whose message names the argument and leave the rig's
snapshot (tree shape and node statistics, sizes, free slots of every pool, request rows, the
requests themselves) unchanged. After every step ``check_invariants()`` and the rig's
slot-ownership check pass (``Rig.check``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from hicache.radix import RadixCache, RadixKey
from hicache.radix.invariants import iter_nodes
from tests.radix.hiradix_rig import POLICIES
from tests.radix.misuse_cases import (
    BAD_COUNTS,
    BAD_EXTRA_KEYS,
    BAD_KEYS,
    BAD_ROWS,
    BAD_SLOTS,
)
from tests.radix.misuse_rig import Rig, make_hiradix, make_radix

ERRORS = (TypeError, ValueError, IndexError)
# Deterministic (derandomize, no database). One bug per run and no explain phase: while some
# misuse is still accepted, a failing run shrinks one case instead of every distinct one.
SETTINGS = settings(
    max_examples=12,
    stateful_step_count=20,
    deadline=None,
    derandomize=True,
    database=None,
    report_multiple_bugs=False,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
)

# (recent sequence, tokens of it to share, new tail): deep trees and prefix hits are common.
keys = st.tuples(
    st.integers(0, 7), st.integers(0, 12), st.lists(st.integers(0, 3), min_size=1, max_size=10)
)
warm_keys = st.tuples(
    st.integers(0, 7), st.integers(0, 12), st.lists(st.integers(0, 3), min_size=8, max_size=10)
)
namespaces = st.sampled_from([None, "lora"])
pick = st.integers(0, 99)
REQ_CALLS = ("cache_finished_req", "cache_unfinished_req")


class MisuseMachine(RuleBasedStateMachine):
    """Valid serving calls and misuse on a RadixCache (HiMisuseMachine adds the host tier)."""

    def __init__(self, cache: RadixCache) -> None:
        super().__init__()
        self.rig = Rig(cache)
        self.new_tokens = itertools.count(1000)  # first tokens of keys no valid call uses
        self.unchanged: dict[str, Any] | None = None  # snapshot since the last valid change

    def rejected(self, label: str, match: str, call: Callable[[Rig], Any]) -> None:
        """``call(rig)`` must raise one of ERRORS naming ``match`` and change no snapshot part."""
        before = self.unchanged or self.rig.snapshot()
        try:
            call(self.rig)
        except ERRORS as exc:
            assert re.search(match, str(exc)), (
                f"{label}: {type(exc).__name__}({exc}) does not name /{match}/"
            )
        except Exception as exc:
            raise AssertionError(f"{label}: raised {type(exc).__name__}: {exc}") from exc
        else:
            raise AssertionError(f"{label}: accepted (expected TypeError/ValueError/IndexError)")
        after = self.rig.snapshot()
        changed = [part for part in before if before[part] != after[part]]
        assert not changed, f"{label}: raised but changed {changed}"
        self.unchanged = after  # the next case of the same rule starts from the same state

    def new_key(self, n: int) -> list[int]:
        return [next(self.new_tokens)] * n

    # ---- valid calls ---------------------------------------------------------------------------

    @initialize(
        seqs=st.lists(warm_keys, min_size=2, max_size=5),
        kv_len=st.integers(1, 16),
        n=st.integers(0, 24),
    )
    def warm_up(self, seqs: list[tuple], kv_len: int, n: int) -> None:
        """Start from a tree of a few related sequences, part of it evicted, one request
        finished and one running (``kv_len`` tokens computed)."""
        for key in seqs:
            self.rig.insert(self.rig.compose(*key), None)
        for cut in (len(seqs), 2 * len(seqs)):
            ids = self.rig.compose(0, cut, [cut])
            self.rig.schedule(ids, None, min(kv_len, len(ids)), load=False)
        self.rig.finish(self.rig.live[0])
        self.rig.cache.evict(n)

    @rule(key=keys, ns=namespaces, kv_len=st.integers(1, 16), load=st.booleans())
    def schedule(self, key: tuple, ns: Any, kv_len: int, load: bool) -> None:
        ids = self.rig.compose(*key)
        self.rig.schedule(ids, ns, min(kv_len, len(ids)), load)

    @precondition(lambda self: self.rig.live)
    @rule(i=pick, token=st.integers(0, 3))
    def decode(self, i: int, token: int) -> None:
        self.rig.decode(self.rig.live[i % len(self.rig.live)], token)

    @precondition(lambda self: self.rig.live)
    @rule(i=pick)
    def cache_unfinished(self, i: int) -> None:
        self.rig.cache.cache_unfinished_req(self.rig.live[i % len(self.rig.live)])

    @precondition(lambda self: self.rig.live)
    @rule(i=pick)
    def cache_finished(self, i: int) -> None:
        self.rig.finish(self.rig.live[i % len(self.rig.live)])

    @rule(key=keys, ns=namespaces)
    def insert(self, key: tuple, ns: Any) -> None:
        self.rig.insert(self.rig.compose(*key), ns)

    @rule(key=keys, ns=namespaces)
    def lock(self, key: tuple, ns: Any) -> None:
        """match_prefix, then inc_lock_ref on the last device node (the root on a miss)."""
        node = self.rig.cache.match_prefix(RadixKey(self.rig.compose(*key), ns)).last_device_node
        self.rig.cache.inc_lock_ref(node)
        self.rig.locks.append(node)

    @precondition(lambda self: self.rig.locks)
    @rule(i=pick)
    def unlock(self, i: int) -> None:
        self.rig.cache.dec_lock_ref(self.rig.locks.pop(i % len(self.rig.locks)))

    @rule(n=st.integers(0, 32))
    def evict(self, n: int) -> None:
        self.rig.cache.evict(n)

    # ---- misuse: each rule tries every case of its classes in the current state -------------

    @rule(i=pick)
    def misuse_requests(self, i: int) -> None:
        """Finishing a request twice; bad rows and extra keys on a copy of a live request."""
        if self.rig.finished:
            self._finish_twice(i % len(self.rig.finished))
        for method in REQ_CALLS if self.rig.live else ():
            for how, make in BAD_ROWS.items():
                row = make(self.rig)
                if row is not None or how == "None":
                    self.rejected(
                        f"{method} with req_pool_idx {how}",
                        "req_pool_idx",
                        self._on_live(method, i, req_pool_idx=row),
                    )
            for how, bad in BAD_EXTRA_KEYS.items():
                self.rejected(
                    f"{method} with extra_key {how}",
                    "extra_key",
                    self._on_live(method, i, extra_key=bad),
                )

    def _finish_twice(self, k: int) -> None:
        row = self.rig.finished[k].req_pool_idx
        reused = "reused" if any(r.req_pool_idx == row for r in self.rig.live) else "free"
        for method in REQ_CALLS:
            self.rejected(
                f"{method} on a finished request (its row {reused})",
                r"(?i)req|finish",
                lambda rig, m=method: getattr(rig.cache, m)(rig.finished[k]),
            )

    def _on_live(self, method: str, i: int, **changes: Any) -> Callable[[Rig], Any]:
        """``cache.<method>`` on a copy of live request ``i`` with ``changes`` applied."""
        return lambda rig: getattr(rig.cache, method)(
            replace(rig.live[i % len(rig.live)], **changes)
        )

    @rule()
    def misuse_inserts(self) -> None:
        """Bad eviction counts; bad slots, keys and extra keys to insert / match_prefix."""
        self._bad_counts()
        n = 2 * self.rig.page
        with self.caller_slots(max(n + self.rig.page, 4)) as fresh:  # 3 pages (4 slots) at least
            if fresh is not None:
                for how, make in BAD_SLOTS.items():
                    value = make(self.rig, fresh, n)
                    if value is not None:
                        self.rejected(
                            f"insert with slots: {how}",
                            "value|slot",
                            self._keyed("insert", self.new_key(n), None, value),
                        )
                self._bad_keys(fresh)

    @contextmanager
    def caller_slots(self, n: int) -> Iterator[torch.Tensor | None]:
        """Fresh slots (or None when full) for the misuse cases inside, freed afterwards."""
        fresh = self.rig.slots(n)
        self.unchanged = None
        yield fresh
        if fresh is not None:
            self.rig.allocator.free(fresh)
        self.unchanged = None

    def _bad_keys(self, fresh: torch.Tensor) -> None:
        for how, bad in BAD_KEYS.items():
            self.rejected(
                f"match_prefix with a key of {how}",
                "token_ids|key",
                lambda rig, bad=bad: rig.cache.match_prefix(bad),
            )
            self.rejected(
                f"insert with a key of {how}",
                "token_ids|key",
                lambda rig, bad=bad: rig.cache.insert(bad, fresh[: len(bad)]),
            )
        for how, bad in BAD_EXTRA_KEYS.items():
            key = self.new_key(len(fresh))
            self.rejected(
                f"match_prefix with extra_key {how}",
                "extra_key",
                self._keyed("match_prefix", key, bad),
            )
            self.rejected(
                f"insert with extra_key {how}", "extra_key", self._keyed("insert", key, bad, fresh)
            )

    def _keyed(
        self, method: str, ids: list[int], extra_key: Any, *args: Any
    ) -> Callable[[Rig], Any]:
        """``cache.<method>(RadixKey(ids, extra_key), *args)``, the key built inside the call."""
        return lambda rig: getattr(rig.cache, method)(RadixKey(ids, extra_key), *args)

    def _bad_counts(self) -> None:
        for how, bad in BAD_COUNTS.items():
            self.rejected(f"evict({how})", "num_tokens", lambda rig, n=bad: rig.cache.evict(n))

    @rule(i=pick)
    def misuse_locks(self, i: int) -> None:
        """dec_lock_ref on a node holding no lock of its own: unlocked, or locked only through a
        descendant (own count = lock_ref - children's lock_refs = 0). To have the latter, a
        device node below another is locked around the cases."""
        cache = self.rig.cache
        deep = [n for n in iter_nodes(cache) if n.value is not None and n.parent is not cache.root]
        held = deep[i % len(deep)] if deep else cache.root
        cache.inc_lock_ref(held)
        own_zero = [
            n
            for n in iter_nodes(cache)
            if n.lock_ref == sum(c.lock_ref for c in n.children.values())
        ]
        for nested in (False, True):
            nodes = [n for n in own_zero if bool(n.lock_ref) == nested]
            if nodes:
                label = (
                    "dec_lock_ref on a node whose own count is 0 while a descendant holds a lock"
                    if nested
                    else "dec_lock_ref on an unlocked node"
                )
                self.rejected(
                    label, "lock|node", self._on_node("dec_lock_ref", nodes[i % len(nodes)].id)
                )
        cache.dec_lock_ref(held)
        self.unchanged = None

    def _on_node(self, method: str, node_id: int) -> Callable[[Rig], Any]:
        return lambda rig: getattr(rig.cache, method)(rig.node(node_id))

    @invariant()
    def consistent(self) -> None:
        self.rig.check()
        self.unchanged = None  # the next rule may change the state


class HiMisuseMachine(MisuseMachine):
    """The same over a HiRadixCache, plus the host tier's calls and misuse."""

    @rule(n=st.integers(0, 16))
    def evict_host(self, n: int) -> None:
        self.rig.cache.evict_host(n)

    @rule(key=keys, ns=namespaces)
    def load_back(self, key: tuple, ns: Any) -> None:
        cache = self.rig.cache
        m = cache.match_prefix(RadixKey(self.rig.compose(*key), ns))
        if m.host_hit_length:
            cache.init_load_back(m.last_host_node, m.host_hit_length)
            cache.ready_to_load_host_cache()

    @rule()
    def events(self) -> None:
        self.rig.cache.check_hicache_events()

    @rule(i=pick)
    def misuse_host(self, i: int) -> None:
        """inc_lock_ref on a host-only node; bad evict_host counts."""
        host_only = [n.id for n in iter_nodes(self.rig.cache) if n.value is None]
        if host_only:
            self.rejected(
                "inc_lock_ref on a host-only node",
                "lock|node|host|device",
                self._on_node("inc_lock_ref", host_only[i % len(host_only)]),
            )
        for how, bad in BAD_COUNTS.items():
            self.rejected(
                f"evict_host({how})", "num_tokens", lambda rig, n=bad: rig.cache.evict_host(n)
            )


@pytest.mark.parametrize("page_size", [1, 4])
def test_radix_cache_misuse_changes_nothing(page_size: int) -> None:
    run_state_machine_as_test(
        lambda: MisuseMachine(make_radix(page_size, "lru")), settings=SETTINGS
    )


@pytest.mark.parametrize("write_policy", POLICIES)
@pytest.mark.parametrize("page_size", [1, 4])
def test_hiradix_cache_misuse_changes_nothing(page_size: int, write_policy: str) -> None:
    run_state_machine_as_test(
        lambda: HiMisuseMachine(make_hiradix(page_size, write_policy)), settings=SETTINGS
    )
