"""The ``hicache bench`` main job: argument checks, a tiny end-to-end run, the plot."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hicache.__main__ import main
from hicache.bench import BenchConfig, run_bench
from hicache.bench.plot import MISSING, plot_rounds
from hicache.bench.progress import ProgressBar
from tests.engine.helpers import TINY


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--users", "-1"],
        ["bench", "--device-tokens", "0"],
        ["bench", "--host-ratio", "0"],
        ["bench", "--host-ratio", "-1"],
        ["bench", "--host-ratio", "nan"],
        ["bench", "--arrival-rate", "inf"],
        ["bench", "--threads", "0"],
        ["bench", "--device", "foo"],
        ["bench", "--policy", "random"],
        ["bench", "--rounds", "two"],
        ["bench", "--heads", "6"],
        ["bench", "--io-backend", "direct", "--mem-layout", "page_head"],
        ["bench", "--device-tokens", "3000000000"],
        ["frobnicate"],
        [],
    ],
)
def test_bad_arguments_exit_nonzero_with_one_line(argv: list[str], tmp_path: Path, capsys) -> None:
    if argv[:1] == ["bench"]:
        argv = [*argv, "--out-dir", str(tmp_path)]
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code != 0
    assert len(err.strip().splitlines()) == 1 and "error" in err and "Traceback" not in err


def test_unwritable_out_dir_is_one_line(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["bench", "--out-dir", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hicache bench: error: --out-dir") and len(err.splitlines()) == 1


def test_module_entry_point_reports_without_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hicache", "bench", "--answer-len", "-4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "hicache bench: error: --answer-len must be positive, got -4"


def test_tiny_bench_writes_table_json_and_png(tmp_path: Path) -> None:
    cfg = BenchConfig.from_args({**TINY, "out_dir": str(tmp_path)})
    out = io.StringIO()
    threads = torch.get_num_threads()
    results = run_bench(cfg, progress=False, out=out)
    assert torch.get_num_threads() == threads, "the bench must restore torch's thread count"
    table = out.getvalue()
    for row in (
        "hit rate: device (L1)",
        "hit rate: host (L2)",
        "prefill tokens computed",
        "prefill tokens reused",
        "TTFT p50 (ms)",
        "TTFT p99 (ms)",
        "throughput",
        "host->device (GB/s)",
        "device->host (MB)",
        "evicted from device",
        "host tier vs device-only",
    ):
        assert row in table, row
    saved = json.loads((tmp_path / "results.json").read_text())
    for mode in ("device-only", "host-tier"):
        assert saved[mode]["summary"]["requests"] == TINY["users"] * TINY["rounds"]
        assert len(saved[mode]["rounds"]) == TINY["rounds"]
        first = saved[mode]["rounds"][0]
        assert first["hit_rate"] == pytest.approx(first["device_hit_rate"] + first["host_hit_rate"])
        assert len(first["ttft_ms"]) == TINY["users"]
    host = results["host-tier"]["summary"]
    assert host["host_hit_rate"] > 0 and host["h2d_bytes"] > 0 and host["d2h_bytes"] > 0
    assert host["hit_rate"] > results["device-only"]["summary"]["hit_rate"]
    assert (tmp_path / "rounds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_bar_off_a_terminal_writes_one_line_per_tenth() -> None:
    stream = io.StringIO()
    bar = ProgressBar(50, "mode", stream)
    for _ in range(50):
        bar.update(note="round 1/1")
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 11 and "\r" not in stream.getvalue()
    assert lines[-1].startswith("mode") and "50/50 100%" in lines[-1]


def test_plot_without_matplotlib_says_why_and_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    assert plot_rounds(tmp_path / "rounds.png", {}) == MISSING
    assert not (tmp_path / "rounds.png").exists()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal_is_tqdms() -> None:
    pytest.importorskip("tqdm")
    stream = _Terminal()
    bar = ProgressBar(4, "mode", stream)
    for _ in range(4):
        bar.update(note="round 1/1")
    bar.close()
    last = stream.getvalue().split("\r")[-1]
    assert last.startswith("mode: 100%") and "4/4" in last and "round 1/1" in last
