"""HiRadixCache under seeded random stress and targeted fault scenarios (bounded for CI).

The random scenarios (``hicache.stress``) check what each op changed after it (slots, locks,
sizes, the bytes of new copies) and everything (``check_invariants``, slot ownership from
scratch, every cached token's KV bytes) every ``full_every`` ops and at the end; the targeted
tests pin down the situations random runs reach only rarely. ``tests/stress/test_planted_bugs``
shows both kinds of check find planted bugs. The README's ``python -m hicache.stress`` command
runs the matrix longer.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from hicache.pools import MHATokenToKVPool, TokenToKVPoolAllocator
from hicache.radix import HiRadixCache, RadixKey
from hicache.stress import checker
from hicache.stress.__main__ import main
from hicache.stress.config import StressConfig
from hicache.stress.faults import Faults, InjectedFault
from hicache.stress.oracle import write_kv
from hicache.stress.runner import matrix, run
from hicache.stress.workload import SALTS, TENANTS

ACTIVITY = ("evicted", "host_evicted", "load_back", "finished", "aborted", "cache_unfinished_req")
SCENARIOS = matrix(StressConfig(ops=1000, full_every=100, seed=7))
FAULTY = matrix(
    StressConfig(ops=500, full_every=100, seed=11, p_alloc_none=0.1, p_transfer_fail=0.1)
)
# The full matrix, marked slow (`pytest -m slow`; CI runs it once per change to the stress
# harness, see scripts/stamp_stress.sh): every route x page sizes 1, 4 and 64 x every (write,
# eviction) policy pair, each scenario longer and with its own seed.
FULL_PAGES = (1, 4, 64)
FULL = matrix(StressConfig(ops=3000, full_every=500, seed=101), FULL_PAGES, full=True)
FULL_FAULTY = matrix(
    StressConfig(ops=1500, full_every=250, seed=211, p_alloc_none=0.1, p_transfer_fail=0.1),
    FULL_PAGES,
    full=True,
)
_totals: Counter[str] = Counter()


def _matrix_params(short: list[StressConfig], full: list[StressConfig]) -> list:
    """``short`` in the default run, ``full`` (ids prefixed ``full/``) only under ``-m slow``."""
    return [pytest.param(c, id=c.label()) for c in short] + [
        pytest.param(c, id=f"full/{c.label()}", marks=pytest.mark.slow) for c in full
    ]


def _assert_clean(report) -> None:
    assert not report.violations, "\n".join(report.violations[:10])


@pytest.mark.parametrize("cfg", _matrix_params(SCENARIOS, FULL))
def test_random_scenario_keeps_every_invariant_and_byte(cfg):
    report = run(cfg)
    _assert_clean(report)
    assert report.counts["evicted"] > 0 and report.counts["finished"] > 0
    _totals.update(report.counts)


def test_random_scenarios_exercised_every_path():
    """Runs after the matrix above: across it every interesting path happened many times."""
    if not _totals:
        pytest.skip("run together with the scenario matrix")
    assert all(_totals[name] >= 20 for name in ACTIVITY), dict(_totals)


@pytest.mark.parametrize("cfg", _matrix_params(FAULTY, FULL_FAULTY))
def test_random_scenario_survives_injected_faults(cfg):
    report = run(cfg)
    _assert_clean(report)
    assert sum(report.injected.values()) > 0


# ---- targeted scenarios ----------------------------------------------------------------------


def _cache(size: int = 12, **kwargs) -> HiRadixCache:
    dev = MHATokenToKVPool(size, 1, torch.float32, 1, 8, 2, "cpu")
    allocator = TokenToKVPoolAllocator(size, 1, "cpu", kvcache=dev)
    kwargs = {"load_back_threshold": 1, **kwargs}
    return HiRadixCache(None, allocator, 1, **kwargs)


def _insert(cache: HiRadixCache, tokens: list[int], tenant=None) -> None:
    allocator = cache.token_to_kv_pool_allocator
    slots = allocator.alloc(len(tokens))
    write_kv(
        allocator.get_kvcache(),
        slots,
        torch.tensor(tokens),
        torch.arange(len(tokens)),
        SALTS[tenant],
    )
    cache.insert(RadixKey(tokens, tenant), slots)


def _load(cache: HiRadixCache, tokens: list[int], tenant=None) -> torch.Tensor:
    """Match, load back, issue the loads; the prefix slots a request would read."""
    m = cache.match_prefix(RadixKey(tokens, tenant))
    assert not checker.namespace(checker.path_to(cache, m.last_host_node), tenant)
    loaded, _ = cache.init_load_back(m.last_host_node, m.host_hit_length)
    cache.ready_to_load_host_cache()
    return torch.cat([m.device_indices, loaded])


def _assert_served(cache: HiRadixCache, slots: torch.Tensor, tokens: list[int], tenant=None):
    pool = cache.token_to_kv_pool_allocator.get_kvcache()
    assert slots.numel() == len(tokens)
    assert not checker.check_prefix(pool, slots, tokens, SALTS[tenant])


def _assert_all_free(cache: HiRadixCache) -> None:
    allocator, host = cache.token_to_kv_pool_allocator, cache.cache_controller.mem_pool_host
    assert allocator.available_size() == allocator.size
    assert host.available_size() == host.size


def test_extra_key_isolation_in_both_tiers():
    """Identical tokens under three namespaces (with different KV): never a cross hit."""
    cache = _cache(size=16, hicache_ratio=4.0)
    tokens = list(range(1, 5))
    for tenant in TENANTS:
        _insert(cache, tokens, tenant)
    assert cache.evict(12) == 12  # all three now live on the host only
    for tenant in TENANTS:
        assert cache.match_prefix(RadixKey(tokens, tenant)).host_hit_length == 4
        assert cache.match_prefix(RadixKey(tokens, "other")).last_host_node is cache.root
        _assert_served(cache, _load(cache, tokens, tenant), tokens, tenant)
    cache.check_invariants()
    assert not checker.sweep(cache)


def test_load_back_never_host_evicts_its_own_chain():
    """write_back, host full: the eviction a load-back triggers backs up a device leaf, which
    host-evicts; the node being loaded is locked and must not be the one evicted."""
    cache = _cache(size=12, hicache_ratio=1.5, write_policy="write_back")
    a, b, e = list(range(1, 13)), list(range(20, 26)), list(range(40, 52))
    _insert(cache, a)
    cache.evict(12)
    _insert(cache, b)
    cache.evict(6)
    _insert(cache, e)
    assert cache.cache_controller.mem_pool_host.available_size() == 0
    _assert_served(cache, _load(cache, a), a)
    cache.check_hicache_events()
    cache.check_invariants()
    assert not checker.sweep(cache)


def test_failed_load_is_never_served_and_is_retried():
    cache = _cache()
    tokens = list(range(1, 9))
    _insert(cache, tokens)
    cache.evict(8)
    faults = Faults(random.Random(0), p_transfer_fail=1.0)
    faults.failing_load(cache.cache_controller.mem_pool_host)
    m = cache.match_prefix(tokens)
    cache.init_load_back(m.last_host_node, m.host_hit_length)
    with pytest.raises(InjectedFault):
        cache.ready_to_load_host_cache()
    cache.check_invariants()
    loading, _ = checker.pending(cache.cache_controller)
    assert loading.numel() == 8, "the failed batch must stay queued (its slots are not served)"
    faults.enabled = False
    _assert_served(cache, _load(cache, tokens), tokens)  # the retry lands before any read
    cache.check_hicache_events()
    assert cache.protected_size() == 0


@pytest.mark.parametrize("io_backend", ["kernel", "direct"])
@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_device_allocator_short_in_the_middle_of_a_load_back(policy, io_backend):
    cache = _cache(write_policy=policy, io_backend=io_backend)
    tokens = list(range(1, 9))
    _insert(cache, tokens)
    cache.evict(8)
    faults = Faults(random.Random(0), p_alloc_none=1.0)
    faults.flaky_alloc(cache.token_to_kv_pool_allocator, "device")
    m = cache.match_prefix(tokens)
    loaded, node = cache.init_load_back(m.last_host_node, m.host_hit_length)
    assert loaded.numel() == 0 and node is cache.root
    assert m.last_host_node.evicted and m.last_host_node.lock_ref == 0
    cache.check_invariants()
    faults.restore()
    _assert_served(cache, _load(cache, tokens), tokens)


def test_reset_with_writes_and_loads_queued():
    cache = _cache(size=16, hicache_ratio=2.0)
    faults = Faults(random.Random(0), p_transfer_fail=1.0)
    faults.failing_backup(cache.cache_controller.mem_pool_host)
    faults.failing_load(cache.cache_controller.mem_pool_host)
    faults.enabled = False
    _insert(cache, list(range(1, 9)))
    cache.evict(8)
    faults.enabled = True
    with pytest.raises(InjectedFault):
        _insert(cache, list(range(20, 24)))  # its backup stays queued
    m = cache.match_prefix(list(range(1, 9)))
    cache.init_load_back(m.last_host_node, m.host_hit_length)
    with pytest.raises(InjectedFault):
        cache.ready_to_load_host_cache()  # the load stays queued too
    ctrl = cache.cache_controller
    assert ctrl.write_queue and ctrl.load_queue
    cache.reset()
    cache.check_invariants()
    _assert_all_free(cache)
    assert not (ctrl.write_queue or ctrl.load_queue or ctrl.ack_write_queue)
    faults.enabled = False
    _insert(cache, list(range(1, 9)))
    cache.evict(8)
    _assert_served(cache, _load(cache, list(range(1, 9))), list(range(1, 9)))


def test_cli_runs_a_bounded_matrix(capsys):
    assert main(["--ops", "40", "--only", "mha/kernel", "--faults", "0.05"]) == 0
    out, err = capsys.readouterr()
    assert "TOTAL scenarios=6" in out and "violations=0" in out and "ops/s=" in out
    assert err == "", "no progress unless stderr is a terminal or --progress is given"


def test_cli_table_columns_line_up_for_labels_over_48_characters(capsys):
    assert main(["--ops", "20", "--only", "mha/direct/page_first_direct"]) == 0
    rows = [
        line
        for line in capsys.readouterr().out.splitlines()
        if " ops=" in line and not line.startswith("TOTAL")
    ]
    assert max(len(line.split(" ops=")[0]) for line in rows) > 48
    assert len({line.index(" ops=") for line in rows}) == 1


def test_cli_progress_shows_ops_rate_and_violations(capsys):
    assert main(["--ops", "250", "--only", "mla/direct/layer_first/p1", "--progress"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("1/1") and "0/250" in lines[0]
    assert any("100/250" in line and "ops/s violations=0" in line for line in lines)
    assert "250/250 100%" in lines[-1] and "violations=0" in lines[-1]


@pytest.mark.parametrize("cfg", [SCENARIOS[0], FAULTY[13]], ids=["p1", "p64-faults"])
def test_full_checks_after_every_op_agree_with_the_incremental_ones(cfg):
    """A full check (and a fresh tracker) after every op: the incremental checks and their
    shadow state never disagree with a check from scratch."""
    report = run(cfg.with_(ops=300, full_every=1))
    _assert_clean(report)
    assert report.counts["evicted"] and report.counts["load_back"]


CUDA = matrix(
    StressConfig(
        ops=300, full_every=100, seed=5, device="cuda", p_alloc_none=0.05, p_transfer_fail=0.05
    )
)[::2]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cfg", CUDA, ids=[c.label() for c in CUDA])
def test_random_scenario_on_cuda(cfg):
    """Real streams and events: a request reads its prefix through the pool's getters, which
    wait (GPU-side) on the load batch ``ready_to_load_host_cache`` issued."""
    _assert_clean(run(cfg))
