"""The TP fuzz: every scenario runs clean with agreement on (2 ranks, a few hundred steps, one
launch for all), the rank-local ones diverge with agreement off, a killed rank stops the others
with TPError; one rank runs in process; the harness's parts (the rank's oracle shard, the
fault rng, slow acks) do what the harness relies on. ``-m slow``: 1e4 steps, 2 and 4 ranks."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from hicache.stress import oracle
from hicache.stress.driver import Driver
from hicache.stress.tp_fuzz.faults import SlowEvent
from hicache.stress.tp_fuzz.fuzz import FuzzReport, expected_outcome, run_fuzz
from hicache.stress.tp_fuzz.rank import rank_main
from hicache.stress.tp_fuzz.scenarios import RANK_LOCAL, SCENARIOS, STORAGE, FuzzConfig

BASE = FuzzConfig(ranks=2, steps=300, seed=3, timeout_s=15, full_every=50)
ON = [replace(BASE, scenario=s) for s in SCENARIOS if s != "rank_killed"] + [
    replace(BASE, scenario="failing_transfer", kind="mla", seed=4),
    replace(BASE, scenario="host_alloc", page_size=64, rate=0.3, seed=5),
    replace(BASE, scenario="slow_transfer", write_policy="write_back", seed=6),
    replace(BASE, scenario="storage_errors", storage_tiering="exclusive", rate=0.3, seed=7),
    replace(BASE, scenario="mixed", tiering="exclusive", seed=7),
    replace(BASE, scenario="storage_errors", tiering="exclusive", kind="mla", page_size=4, seed=8),
]
OFF = [replace(c, agree=False) for c in ON if c.scenario in ("none", *RANK_LOCAL)]


def _by_label(cfgs: list[FuzzConfig]) -> dict[str, FuzzReport]:
    return {rep.cfg.label(): rep for rep in run_fuzz(cfgs)}


@pytest.fixture(scope="module")
def agree_on() -> dict[str, FuzzReport]:
    return _by_label(ON)


@pytest.fixture(scope="module")
def agree_off() -> dict[str, FuzzReport]:
    return _by_label(OFF)


def _clean(rep: FuzzReport) -> None:
    assert rep.outcome == "clean", "\n".join(rep.detail)
    assert rep.steps == rep.cfg.steps and rep.ops > rep.cfg.steps // 2
    assert (rep.divergences, rep.hangs, rep.leaks, rep.violations) == (0, 0, 0, 0)


@pytest.mark.parametrize("cfg", ON, ids=FuzzConfig.label)
def test_every_scenario_runs_clean_with_agreement(cfg: FuzzConfig, agree_on) -> None:
    rep = agree_on[cfg.label()]
    _clean(rep)
    assert rep.faults > 0 or cfg.scenario == "none"
    assert rep.collectives >= rep.steps  # at least the harness's digest check per step


@pytest.mark.parametrize("cfg", OFF, ids=FuzzConfig.label)
def test_rank_local_faults_diverge_without_agreement(cfg: FuzzConfig, agree_off) -> None:
    rep = agree_off[cfg.label()]
    if cfg.scenario == "none":
        return _clean(rep)  # no fault, nothing rank-local: the ranks stay together
    assert rep.outcome in ("diverged", "tp_error"), "\n".join(rep.detail)
    assert rep.expected and rep.outcome in expected_outcome(cfg)
    assert rep.steps < cfg.steps
    # a storage tier's backups finish on each rank's own thread: without agreement their
    # timing alone is rank-local, and may split the ranks before the first fault fires
    assert rep.faults > 0 or cfg.scenario in STORAGE
    if rep.outcome == "diverged":
        assert any("digests differ" in line for line in rep.detail)
        assert any(line.startswith("  node ranks") for line in rep.detail)  # names the node


def test_host_alloc_and_a_transfer_fault_diverge_off_and_run_clean_on(agree_on, agree_off):
    for scenario in ("host_alloc", "slow_transfer", "failing_transfer"):
        on = replace(BASE, scenario=scenario)
        _clean(agree_on[on.label()])
        assert agree_off[replace(on, agree=False).label()].divergences == 1


@pytest.mark.parametrize(("agree", "ranks"), [(True, 3), (False, 2)])
def test_a_killed_rank_stops_every_other_with_tp_error(agree: bool, ranks: int) -> None:
    cfg = replace(BASE, ranks=ranks, steps=160, scenario="rank_killed", agree=agree, fault_rank=1)
    (rep,) = run_fuzz([cfg])
    assert rep.outcome == "killed", "\n".join(rep.detail)
    assert rep.hangs == 0
    assert sum("TPError" in line for line in rep.detail) == ranks - 1  # every survivor
    assert rep.steps in (cfg.kill_step() - 1, cfg.kill_step())  # stopped in the step it died


def test_one_rank_runs_every_scenario_in_process() -> None:
    cfgs = [replace(c, ranks=1, fault_rank=0, steps=150) for c in ON]
    for cfg, result in zip(cfgs, rank_main(None, tuple(cfgs)), strict=True):
        assert result.violations == [] and result.diverged_at is None, result.violations
        assert result.steps == cfg.steps and result.tp_error is None
        assert result.collectives == 0  # one rank: no collective at all
        assert sum(result.injected.values()) > 0 or cfg.scenario in ("none", "storage_errors")


def test_each_rank_holds_its_own_shard_of_the_oracle() -> None:
    tokens, positions = torch.randint(0, 50, (6,)), torch.arange(6)
    try:
        oracle.set_shard(0)
        whole = oracle.kv_values(tokens, positions, 1, 0, 4, 8, torch.float32)
        oracle.set_shard(1)
        second = oracle.kv_values(tokens, positions, 1, 0, 2, 8, torch.float32)
    finally:
        oracle.set_shard(0)
    assert torch.equal(second, whole[:, 2:])  # rank 1 of 2 holds heads 2..3 of the model
    assert not torch.equal(second, whole[:, :2])
    with pytest.raises(ValueError, match="rank"):
        oracle.set_shard(-1)


def test_a_shard_mix_up_is_caught_by_the_checks() -> None:
    driver = Driver(BASE.stress_config(0))
    try:
        for _ in range(40):
            driver.admit()
            driver.advance()
        driver.check_full()
        assert driver.violations == []
        oracle.set_shard(1)  # the cache now holds another rank's bytes
        driver.check_full()
    finally:
        oracle.set_shard(0)
    assert any("differ" in v for v in driver.violations)


def test_faults_never_draw_from_the_op_stream() -> None:
    driver = Driver(replace(BASE.stress_config(0), p_alloc_none=0.5))
    assert driver.faults.rng is not driver.rng
    state = driver.rng.getstate()
    fired = sum(driver.stack.allocator.alloc(1) is None for _ in range(40))
    assert 0 < fired < 40 and driver.rng.getstate() == state


def test_a_slow_event_reports_not_done_for_its_polls() -> None:
    class Done:
        waited = False

        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            self.waited = True

    polls = random.randint(2, 5)
    slow = SlowEvent(Done(), polls)
    assert [slow.query() for _ in range(polls + 2)] == [False] * polls + [True, True]
    slow = SlowEvent(Done(), polls)
    slow.synchronize()
    assert slow.query() and slow.waited


SLOW = [s for s in SCENARIOS if s != "rank_killed"]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"tp{n}")
def long_runs(request) -> dict[str, FuzzReport]:
    cfg = replace(BASE, ranks=request.param, steps=10_000, full_every=500, timeout_s=60)
    return _by_label([replace(cfg, scenario=s, seed=100 + i) for i, s in enumerate(SLOW)])


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SLOW)
def test_long_runs_stay_clean(scenario: str, long_runs, capsys) -> None:
    (rep,) = [r for label, r in long_runs.items() if label.startswith(scenario + "/")]
    with capsys.disabled():
        print("\n" + rep.row())
    _clean(rep)


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_long_run_with_a_killed_rank(ranks: int, capsys) -> None:
    cfg = replace(BASE, ranks=ranks, steps=10_000, scenario="rank_killed", timeout_s=60)
    (rep,) = run_fuzz([cfg])
    with capsys.disabled():
        print("\n" + rep.row())
    assert rep.outcome == "killed" and rep.hangs == 0, "\n".join(rep.detail)
