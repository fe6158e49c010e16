"""TPGroup and launch_ranks: agreement over real gloo ranks, peer failures, dead and stuck
ranks, digests; one rank and agree=False never touch a collective."""

from __future__ import annotations

import random

import pytest
import torch.distributed as dist

from hicache.tp import RankFailed, TPGroup, as_tp_group, launch_ranks, run_ranks
from tests.tp import ranks


def test_three_ranks_agree_on_min_max_peer_failure_and_digests() -> None:
    for r, seen in enumerate(run_ranks(ranks.agreement, 3, timeout_s=60)):
        assert seen["rank_size"] == (r, 3, True)
        assert seen["agree"] == ([10, -2, 7], [4, 5])  # min over 10+r, -r, 7; max r*r, 5-r
        assert seen["empty"] == ([], [])
        assert seen["all_ok_true"] is True and seen["all_ok_one_false"] is False
        name, message = seen["digest_mismatch"]
        assert name == "TPError" and "diverged" in message and "digest" in message
        if r == 2:
            assert seen["failed"] == ("StepFailed", "rank 2 step failed")
        else:
            assert seen["failed"] == ("TPPeerError", 2, "the step")
        assert seen["after_failure"] == ([0], [2])
        assert seen["agree_off"] == (False, ([r], [r]), r == 0)
        assert seen["off_collectives"] == (0, 0)
        assert seen["off_failed_reraises"] is True


def test_carried_votes_ride_on_the_next_collective_and_conditions_veto() -> None:
    for seen in run_ranks(ranks.carried_votes, 3, timeout_s=60):
        assert seen["carried"] == ((([0], [2]), False), 1)  # the vote adds no collective
        assert seen["resolve_none"] == (None, 0)
        assert seen["resolved"] == (True, 1)
        # a failed condition makes the keep_if_all inside it fail, giving back what it got
        assert seen["condition_fails"] == ((None, False, ["row"]), 1)
        assert seen["condition_holds"] == (("row", True, ["row"]), 1)
        assert seen["condition_unused"] == (True, 1)  # resolved on leaving the block


def test_a_dead_rank_breaks_the_group_for_the_others_and_launch_reports_it() -> None:
    outcomes = launch_ranks(ranks.dead_peer, 3, timeout_s=40)
    assert outcomes[1].error == "exited"
    assert outcomes[2].error == "ValueError" and "gives up" in outcomes[2].detail
    assert outcomes[0].error is None, outcomes[0].detail
    seen = outcomes[0].result
    name, waited = seen["first"]
    assert name == "TPError" and waited < 15  # the collective timeout at most, no hang
    assert seen["second"] == ("TPError", True, 0)  # raised at once, no collective issued
    message = str(RankFailed(outcomes))
    assert "2 of 3 ranks failed" in message and "rank 1: exited" in message


def test_a_stuck_rank_times_out_the_collective_and_is_killed_by_the_launcher() -> None:
    outcomes = launch_ranks(ranks.stuck_peer, 2, timeout_s=20)  # spawn takes seconds
    assert outcomes[1].error == "killed"
    assert outcomes[0].error is None, outcomes[0].detail
    seen = outcomes[0].result
    assert 1.0 < seen["first"] < 10.0  # about timeout_s=1.5
    assert seen["second"] is True


def test_one_rank_returns_its_own_values_without_collectives() -> None:
    tp = TPGroup(None, timeout_s=1)
    values = [random.randrange(-1000, 1000) for _ in range(5)]
    assert (tp.rank, tp.size, tp.active) == (0, 1, False)
    assert tp.agree(values[:3], values[3:], where="x") == (values[:3], values[3:])
    assert tp.all_ok(False, where="x") is False
    assert tp.carry(False, where="x").ok is False and tp.carry(True, where="x").ok is True
    with tp.condition(False, where="x") as vote:
        assert vote.ok is False and tp.keep_if_all(1, print, where="x") is None
    tp.check_digest(b"anything", where="x")
    with pytest.raises(KeyError):
        tp.agree([1], where="x", failed=KeyError("own"))
    assert tp.collectives == 0
    assert as_tp_group(tp) is tp
    assert as_tp_group(None).size == 1


@pytest.mark.parametrize("bad", [object(), "gloo", 3])
def test_as_tp_group_rejects_a_wrong_type(bad: object) -> None:
    with pytest.raises(TypeError, match="tp_group"):
        as_tp_group(bad)


def test_bad_settings_are_rejected() -> None:
    for timeout in (0, -1.0, "5", True):
        with pytest.raises(ValueError, match="timeout_s"):
            TPGroup(None, timeout_s=timeout)  # type: ignore[arg-type]
    for name, flag in (("agree", "no"), ("agree", 0), ("debug", None)):
        with pytest.raises(TypeError, match=f"{name} must be a bool"):
            TPGroup(None, **{name: flag})
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="not initialized"):
        TPGroup(object())
    for size in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="size"):
            launch_ranks(ranks.agreement, size)  # type: ignore[arg-type]
