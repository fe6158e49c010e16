"""The agreement through shared memory (``hicache.tp.shm``): the same answers as the process
group on random vectors, the fallback where ranks cannot share a segment, and a peer that exits
or stalls, on real ranks."""

from __future__ import annotations

import glob
import os

import pytest

from hicache.tp import TPGroup, launch_ranks, run_ranks, shm
from tests.tp import shm_ranks

pytestmark = pytest.mark.skipif(not shm.supported(), reason="x86-64 with /dev/shm only")


@pytest.mark.parametrize("transport", ["auto", "group"])
def test_three_ranks_get_every_minimum_and_maximum(transport: str) -> None:
    seen = run_ranks(shm_ranks.agree_many, 3, 11, transport, timeout_s=120)
    channel = "shm" if transport == "auto" else "group"
    for rank in seen:
        assert rank["wrong"] == []
        assert rank["channel"] == channel
        assert rank["collectives"] == shm_ranks.ROUNDS + 1
        assert rank["ok"] is False  # rank 1 said no
    assert glob.glob(os.path.join(shm.SHM_DIR, f"hicache-tp-{seen[0]['pid']}-*")) == []


def test_ranks_that_cannot_share_the_segment_use_the_process_group() -> None:
    for rank, seen in enumerate(run_ranks(shm_ranks.apart, 2, timeout_s=120)):
        assert seen["channel"] == "group"
        assert seen["got"] == ([5], [1])
        assert seen["left"] == []  # rank 0 removed the segment it made
        assert rank in (0, 1)


def test_an_exited_peer_breaks_the_group_without_waiting_for_the_timeout() -> None:
    outcomes = launch_ranks(shm_ranks.peer_exits, 2, timeout_s=60)
    assert outcomes[1].error == "exited"
    assert outcomes[0].error is None, outcomes[0].detail
    message, waited, channel = outcomes[0].result["first"]
    assert channel == "shm" and "rank 1" in message and "exited" in message
    assert waited < 5.0  # timeout_s is 20
    assert outcomes[0].result["second"] is True


def test_a_stalled_peer_times_out_the_agreement() -> None:
    outcomes = launch_ranks(shm_ranks.peer_stalls, 2, timeout_s=30)
    assert outcomes[1].error == "killed"
    seen = outcomes[0].result
    assert 0.9 < seen["waited"] < 6.0 and "timeout" in seen["message"]


def test_ranks_passing_different_lengths_both_raise() -> None:
    for message in run_ranks(shm_ranks.mismatched, 2, timeout_s=60):
        assert "words to one round" in message


def test_an_unknown_transport_is_rejected() -> None:
    with pytest.raises(ValueError, match="transport"):
        TPGroup(None, transport="nccl")
