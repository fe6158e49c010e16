"""io_backend="auto": the per-batch choice, and that every layout accepts it (CPU)."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import SUPPORTED_PAIRS, auto_backend, check_pair

KIB = 1024


def _runs(n_runs: int, length: int) -> torch.Tensor:
    """``n_runs`` runs of ``length`` consecutive slots, far apart."""
    starts = torch.arange(n_runs) * (length + 1000)
    return (starts[:, None] + torch.arange(length)[None, :]).reshape(-1)


@pytest.mark.parametrize(("n_runs", "length"), [(1, 1), (4, 1), (3, 16), (1, 64), (5, 7)])
def test_mean_run_counts_runs_on_both_sides(n_runs: int, length: int) -> None:
    host = _runs(n_runs, length)
    assert auto_backend.mean_run(host, host + 5) == length
    # The device side breaking every slot breaks every run.
    assert auto_backend.mean_run(host, torch.arange(host.numel()) * 2) == 1


@pytest.mark.parametrize(
    ("length", "item", "expected"),
    [
        (1, 2 * KIB, "kernel"),  # scattered single slots
        (16, 2 * KIB, "kernel"),  # 32 KiB runs
        (32, 2 * KIB, "direct"),  # 64 KiB runs: the copy engines' line rate
        (64, 1 * KIB, "direct"),
        (4, 16 * KIB, "direct"),
        (1, 64 * KIB, "direct"),
    ],
)
def test_layer_first_picks_by_run_bytes(length: int, item: int, expected: str) -> None:
    runs = -(-auto_backend.ENGINE_MIN_BATCH_BYTES // (length * item))  # a batch of 4 MiB a part
    host = _runs(runs, length)
    got = auto_backend.resolve("auto", "layer_first", host, host + 3, item)
    assert got == expected


def test_small_batches_stay_on_the_kernel() -> None:
    """Long runs, but one layer of one part under ENGINE_MIN_BATCH_BYTES: the kernel."""
    item = 2 * KIB
    fits = auto_backend.ENGINE_MIN_BATCH_BYTES // item  # slots in exactly the floor
    for slots, expected in ((fits - 64, "kernel"), (fits, "direct")):
        host = torch.arange(slots)
        assert auto_backend.resolve("auto", "layer_first", host, host, item) == expected


@pytest.mark.parametrize(
    ("layout", "expected"),
    [("page_first", "kernel"), ("page_head", "kernel"), ("page_first_direct", "direct")],
)
def test_single_backend_layouts(layout: str, expected: str) -> None:
    host = _runs(64, 64)
    for item in (64, 64 * KIB):
        assert auto_backend.resolve("auto", layout, host, host, item) == expected


@pytest.mark.parametrize("backend", ["kernel", "direct"])
def test_concrete_backends_pass_through(backend: str) -> None:
    host = _runs(1, 1)
    assert auto_backend.resolve(backend, "layer_first", host, host, 1) == backend


def test_auto_takes_every_layout_and_resolves_to_a_supporting_backend() -> None:
    host = _runs(64, 8)
    for layout in SUPPORTED_PAIRS["auto"]:
        check_pair(layout, "auto")
        for item in (64, 64 * KIB):
            backend = auto_backend.resolve("auto", layout, host, host, item)
            assert layout in SUPPORTED_PAIRS[backend]


def test_device_indices_only_on_the_gpu_mean_the_kernel() -> None:
    """Without a CPU copy of the device slots (or with one claiming to be on CUDA) the runs
    cannot be counted without a device-to-host wait: the kernel, however long the runs."""

    class OnCuda(torch.Tensor):
        @property
        def is_cuda(self) -> bool:  # type: ignore[override]
            return True

    host = torch.arange(auto_backend.ENGINE_MIN_BATCH_BYTES // 1024)
    assert auto_backend.resolve("auto", "layer_first", host, host, 1024) == "direct"
    assert auto_backend.resolve("auto", "layer_first", host, None, 1024) == "kernel"
    on_gpu = host.clone().as_subclass(OnCuda)
    assert auto_backend.resolve("auto", "layer_first", host, on_gpu, 1024) == "kernel"
