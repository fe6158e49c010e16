"""Where TP ranks run (``place_rank``), which tensors a group's backend takes, the launcher's
argument checks, and a stuck model collective bounded by the group's timeout (CPU; the CUDA
runs are in test_tp_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from hicache.tp import RankPlacement, launch_ranks, place_rank, placements, takes_cpu_tensors
from tests.tp import ranks

NCCL = "cpu:gloo,cuda:nccl"


@pytest.mark.parametrize(
    "size, gpus, devices, backend",
    [
        (2, 2, ["cuda:0", "cuda:1"], NCCL),  # each rank its own GPU: NCCL for CUDA tensors
        (2, 8, ["cuda:0", "cuda:1"], NCCL),
        (4, 4, ["cuda:0", "cuda:1", "cuda:2", "cuda:3"], NCCL),
        (2, 1, ["cuda:0", "cuda:0"], "gloo"),  # two ranks share the GPU: NCCL refuses that
        (3, 2, ["cuda:0", "cuda:1", "cuda:0"], "gloo"),
        (1, 1, ["cuda:0"], NCCL),
    ],
)
def test_cuda_rank_r_runs_on_gpu_r_mod_count(
    size: int, gpus: int, devices: list[str], backend: str
) -> None:
    got = [place_rank("cuda", r, size, gpus) for r in range(size)]
    assert got == [RankPlacement(r, d, backend) for r, d in enumerate(devices)]


def test_cpu_ranks_run_on_gloo_whatever_the_gpus() -> None:
    for gpus in (0, 2):
        assert place_rank("cpu", 1, 2, gpus) == RankPlacement(1, "cpu", "gloo")
    assert placements("cpu", 3) == [RankPlacement(r, "cpu", "gloo") for r in range(3)]


@pytest.mark.parametrize(
    "args, error, match",
    [
        (("cuda:1", 0, 2, 2), ValueError, "device must be one of"),  # the rank picks its GPU
        (("tpu", 0, 2, 2), ValueError, "device must be one of"),
        ((None, 0, 2, 2), ValueError, "device must be one of"),
        (("cuda", 0, 2, 0), ValueError, "no CUDA device"),
        (("cpu", 2, 2, 0), ValueError, "rank must be < size=2"),
        (("cpu", -1, 2, 0), ValueError, "rank must be >= 0"),
        (("cpu", 0, 0, 0), ValueError, "size must be >= 1"),
        (("cpu", 0, 1.0, 0), TypeError, "size must be an int"),
        (("cuda", 0, 2, -1), ValueError, "device_count must be >= 0"),
    ],
)
def test_place_rank_rejects_bad_arguments(args: tuple, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        place_rank(*args)


@pytest.mark.parametrize(
    "backend, cpu",
    [
        ("gloo", True),
        ("nccl", False),
        ("cpu:gloo,cuda:nccl", True),
        ("cuda:nccl,cpu:gloo", True),
        ("cuda:nccl", False),
        ("cpu:gloo,cuda:gloo", True),
        ("mpi", True),
    ],
)
def test_takes_cpu_tensors(backend: str, cpu: bool) -> None:
    assert takes_cpu_tensors(backend) is cpu


def test_launch_rejects_bad_settings_before_starting_a_rank() -> None:
    with pytest.raises(ValueError, match="device must be one of"):
        launch_ranks(ranks.agreement, 2, device="cuda:0")
    for name in ("timeout_s", "group_timeout_s"):
        for bad in (0, -1.0, "5", True):
            with pytest.raises(ValueError, match=name):
                launch_ranks(ranks.agreement, 2, **{name: bad})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_launch_on_cuda_without_a_gpu_is_refused() -> None:
    with pytest.raises(ValueError, match="no CUDA device"):
        launch_ranks(ranks.agreement, 2, device="cuda")


def test_a_model_all_reduce_with_a_stuck_peer_fails_after_the_group_timeout() -> None:
    """The model's collectives are bounded by the process group's timeout (gloo raises)."""
    outcomes = launch_ranks(ranks.stuck_model_peer, 2, "cpu", timeout_s=40, group_timeout_s=2.0)
    assert [o.error for o in outcomes] == [None, None], outcomes
    name, waited = outcomes[0].result
    assert name == "RuntimeError" and 1.5 < waited < 7.0  # about group_timeout_s=2
