"""TP ranks on CUDA (skipped without a GPU): rank r on ``cuda:{r % device_count}``, so the
two ranks share the GPU of a one-GPU machine (gloo for every collective) and have one each on
a larger one (NCCL for the model's). Agreement, byte-exact load-back on every route, a stuck
model collective, and ``hicache bench --tp 2 --device cuda``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hicache.__main__ import main
from hicache.bench import BenchConfig
from hicache.pools import ROUTES
from hicache.tp import launch_ranks, placements, run_ranks
from tests.engine.helpers import TINY
from tests.tp import cuda_ranks, ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_cuda_ranks_sit_on_their_gpus_and_agree() -> None:
    want = placements("cuda", 2)
    for r, seen in enumerate(run_ranks(cuda_ranks.placement, 2, device="cuda", timeout_s=120)):
        assert (seen["device"], seen["backend"]) == (want[r].device, want[r].backend)
        assert seen["sum"] == [3.0, 3.0, 3.0] and seen["sum_device"] == want[r].device
        assert seen["agree"] == ([5], [1])


def test_cuda_ranks_pass_the_agreement_suite() -> None:
    for r, seen in enumerate(run_ranks(ranks.agreement, 2, device="cuda", timeout_s=120)):
        assert seen["rank_size"] == (r, 2, True)
        assert seen["agree"] == ([10, -1, 7], [1, 5])
        assert seen["all_ok_one_false"] is False and seen["after_failure"] == ([0], [1])
        assert seen["failed"][0] == ("StepFailed" if r == 1 else "TPPeerError")


def test_cuda_load_back_is_byte_exact_on_every_route_of_every_rank() -> None:
    want = placements("cuda", 2)
    for r, seen in enumerate(run_ranks(cuda_ranks.load_back, 2, device="cuda", timeout_s=300)):
        assert seen["device"] == want[r].device and seen["pinned"] is True
        assert len(seen["routes"]) == len(ROUTES)
        assert all(v == "ok" for v in seen["routes"].values()), seen["routes"]
        assert seen["collectives"] > 0


def test_cuda_model_all_reduce_with_a_stuck_peer_fails_after_the_group_timeout() -> None:
    """Ranks sharing a GPU all-reduce CUDA tensors over gloo: a stuck peer raises after the
    group's timeout. (On their own GPUs NCCL's watchdog ends the stuck rank's process.)"""
    if placements("cuda", 2)[0].backend != "gloo":
        pytest.skip("ranks on their own GPUs: NCCL, whose watchdog ends the process")
    outcomes = launch_ranks(
        ranks.stuck_model_peer, 2, "cuda", device="cuda", timeout_s=60, group_timeout_s=2.0
    )
    assert [o.error for o in outcomes] == [None, None], outcomes
    name, waited = outcomes[0].result
    assert name == "RuntimeError" and 1.5 < waited < 7.0


def test_cuda_bench_tp2_runs_and_every_rank_saw_the_same_hits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    opts = {**TINY, "device": "cuda", "tp": 2, "out_dir": tmp_path}
    argv = ["bench", *(f"--{k.replace('_', '-')}={v}" for k, v in opts.items()), "--no-progress"]
    assert main(argv) == 0
    out, want = capsys.readouterr().out, placements("cuda", 2)
    devices = ", ".join(p.device for p in want)
    assert f"TP: 2 ranks on {devices} ({want[0].backend}); every rank saw" in out
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["device"] for r in results["tp_ranks"]] == [p.device for p in want]
    assert results["host-tier"]["summary"]["host_hit_rate"] > 0


def test_cuda_bench_tp_takes_cuda_not_an_indexed_gpu() -> None:
    with pytest.raises(ValueError, match="--device cuda"):
        BenchConfig.from_args({**TINY, "device": "cuda:0", "tp": 2})
