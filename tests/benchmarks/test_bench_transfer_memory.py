"""``benchmarks/bench_transfer.py`` sizes its arenas to the RAM available (it was killed by the
OOM killer on a 24 GiB machine) and gives CPU runs no verdict against the H200's targets."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _report import render_targets  # noqa: E402
from _transfer_args import build_grid, fit_memory, host_bytes, parse_args  # noqa: E402

CPU = torch.device("cpu")


def test_default_cpu_grid_fits_in_a_quarter_of_24_gib():
    shapes = build_grid(parse_args("", []), CPU)
    assert shapes and host_bytes(shapes, CPU, d2d=True) < 6 << 30


def test_fit_memory_keeps_the_highest_priority_prefix_that_fits():
    shapes = build_grid(parse_args("", []), CPU)
    available = psutil.virtual_memory().available
    kept = fit_memory(shapes, lambda s: len(s) * available // len(shapes))
    assert kept == shapes[: len(kept)] and 0 < len(kept) < len(shapes)
    with pytest.raises(SystemExit, match="lower --layers"):
        fit_memory(shapes, lambda s: 2 * available)


def test_cpu_rows_get_no_pass_or_fail():
    row = {"target": "load", "worst": 0.1, "unit": "x copy", "at": "2K", "threshold": 0.9}
    assert "FAIL" in render_targets([{**row, "passed": False}])
    text = render_targets([{**row, "passed": False}], judged=False)
    assert "FAIL" not in text and "n/a (CPU)" in text
