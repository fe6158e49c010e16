"""Random operation sequences on a hybrid tree keep every invariant and conserve every pool."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hicache.radix import RadixKey
from tests.radix.hybrid_rig import HybridRig

PREFIXES = [[1] * 8 + [2] * 8, [1] * 8 + [3] * 8, [4] * 16]

OPS = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 2), st.integers(1, 4), st.booleans()),
    st.tuples(st.just("lock"), st.integers(0, 2), st.integers(1, 4), st.booleans()),
    st.tuples(st.just("unlock"), st.integers(0, 9), st.just(0), st.booleans()),
    st.tuples(st.just("evict_swa"), st.integers(0, 24), st.just(0), st.booleans()),
    st.tuples(st.just("evict_states"), st.integers(0, 3), st.just(0), st.booleans()),
    st.tuples(st.just("evict"), st.integers(0, 24), st.just(0), st.booleans()),
)


def run(rig: HybridRig, ops: list[tuple[str, int, int, bool]]) -> None:
    cache, locked = rig.cache, []
    states_total = rig.state_pool.available_size()
    for op, a, b, flag in ops:
        if op in ("put", "lock"):
            ids = PREFIXES[a][: b * 4]
            if op == "lock":
                node = cache.match_prefix(RadixKey(ids)).last_device_node
                cache.inc_lock_ref(node)
                locked.append(node)
            elif rig.pools.allocator.available_size() >= 16 and rig.state_pool.available_size():
                rig.put(ids, with_state=flag)
        elif op == "unlock" and locked:
            cache.dec_lock_ref(locked.pop(a % len(locked)))
        elif op != "unlock":
            getattr(cache, op)(a)
        rig.check()
        held = cache.stats().components.states_held
        assert rig.state_pool.available_size() + held == states_total
        assert rig.pools.allocator.full_available_size() + cache.total_size() == 64 * rig.page_size


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=25), st.sampled_from([1, 4]), st.sampled_from([4, 12]))
def test_random_sequences_keep_the_invariants(ops, page: int, window: int) -> None:
    run(HybridRig(page_size=page, window=window), ops)
