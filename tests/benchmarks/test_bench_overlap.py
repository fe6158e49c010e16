"""``benchmarks/bench_overlap.py`` and ``bench_issue.py`` run end to end on the CPU (tiny
geometry): every cell is in the JSON with every phase, and each phase was served from the tier it
is meant to measure. No timing is asserted: CPU loads are synchronous."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("cold", "dev_busy", "device", "host", "load")


def run(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    env["TRITON_INTERPRET"] = "1"  # --stub forces the Triton path onto CPU tensors
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_bench_overlap_writes_every_cell(tmp_path: Path) -> None:
    out = tmp_path / "overlap.json"
    text = run("bench_overlap.py", "--device", "cpu", "--quick", "--pairs", "64/16,128/32",
               "--repeats", "1", "--json", str(out))  # fmt: skip
    report = json.loads(out.read_text())
    cells = {
        (c["backend"], c["layers_ahead"], c["page"], c["prefix"], c["suffix"]): c
        for c in report["cells"]
    }
    assert set(cells) == {
        (backend, ahead, page, prefix, suffix)
        for backend in ("kernel", "direct")
        for ahead in (None, 2)
        for page in (1, 64)
        for prefix, suffix in ((64, 16), (128, 32))
    }
    for (_, _, _, prefix, _), cell in cells.items():
        for phase in PHASES:
            assert cell[f"{phase}_ms"] > 0 and len(cell["samples_ms"][phase]) == 1
        assert cell["hits"]["cold"] == [0]  # nothing cached: every token computed
        for phase in ("dev_busy", "device", "host", "load"):  # the prefix, from its tier
            assert cell["hits"][phase] == [prefix], phase
        for key in ("overlap", "host_over_device", "issue_us_per_layer", "host_cpu_ms"):
            assert isinstance(cell[key], float)
    assert text.splitlines()[0].startswith("TTFT medians")  # the table comes last, on stdout


@pytest.mark.parametrize("stub", [False, True])
def test_bench_issue_prints_every_row(stub: bool) -> None:
    extra = ["--stub"] if stub else []
    text = run("bench_issue.py", "--device", "cpu", "--tokens", "64", "--repeats", "1", *extra)
    rows = [line.split() for line in text.splitlines()[3:]]
    assert {(r[0], r[1]) for r in rows} == {
        (b, p) for b in ("kernel", "direct") for p in ("1", "64")
    }
