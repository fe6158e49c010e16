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


def test_three_ranks_agree_through_either_channel_and_fall_back_where_they_cannot_share() -> None:
    seen = run_ranks(shm_ranks.channels, 3, 11, timeout_s=120)
    for rank in seen:
        for transport, channel in (("auto", "shm"), ("group", "group")):
            assert rank[transport]["wrong"] == []  # every min and max right, long vectors too
            assert rank[transport]["channel"] == channel
            assert rank[transport]["collectives"] == shm_ranks.ROUNDS + 1
            assert rank[transport]["ok"] is False  # rank 1 said no
        assert "words to one round" in rank["mismatched"]  # different lengths: all raise
        apart = rank["apart"]  # no segment shared: the process group, still agreeing
        assert apart["channel"] == "group" and apart["got"] == ([5], [2]) and apart["left"] == []
    assert glob.glob(os.path.join(shm.SHM_DIR, f"hicache-tp-{seen[0]['pid']}-*")) == []


def test_an_exited_peer_breaks_the_group_without_waiting_for_the_timeout() -> None:
    outcomes = launch_ranks(shm_ranks.peer_exits, 2, timeout_s=60)
    assert outcomes[1].error == "exited"
    assert outcomes[0].error is None, outcomes[0].detail
    message, waited, channel = outcomes[0].result["first"]
    assert channel == "shm" and "rank 1" in message and "exited" in message
    assert waited < 5.0  # timeout_s is 20
    assert outcomes[0].result["second"] is True


def test_a_stalled_peer_times_out_the_agreement() -> None:
    outcomes = launch_ranks(shm_ranks.peer_stalls, 2, timeout_s=60)
    assert outcomes[1].result == {"slept": 4.0}
    seen = outcomes[0].result
    assert 0.9 < seen["waited"] < 3.5 and "timeout" in seen["message"]


def test_an_unknown_transport_is_rejected() -> None:
    with pytest.raises(ValueError, match="transport"):
        TPGroup(None, transport="nccl")
