"""``hicache replay --layers-pattern``: the state report, sweeps and misuse as one error line."""

import json

import pytest

from hicache.__main__ import main

GEN = ["--sessions", "4", "--turns", "2", "--system-tokens", "512", "--turn-tokens", "512"]
FAST = ["--h2d-gbps", "10", "--d2h-gbps", "10", "--no-progress"]


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "g.jsonl"
    assert main(["replay", "--generate", str(path), "--generate-only", *GEN]) == 0
    return str(path)


def test_report_gives_state_figures_in_text_and_json(trace, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--layers-pattern", "FSL", "--state-bytes", "1000", "--state-slots", "40"]
    assert main(["replay", trace, *argv, "--out-dir", str(out), *FAST]) == 0
    report = json.loads((out / "replay.json").read_text())
    states, config = report["states"], report["config"]
    assert config["layers"] == 3 and config["state_bytes"] == 1000
    assert "states" in report["measured"] and "kv_bytes" in report["measured"]
    assert states["device"]["slots"] == 40 and states["device"]["pool_bytes"] == 40_000
    assert states["device"]["peak_bytes"] == 1000 * states["device"]["held_peak"] > 0
    assert report["kv_bytes"]["device"] == config["device_tokens"] * 2 * 2 * 4 * 2
    text = capsys.readouterr().out
    assert "model FSL (window 128), states at finish+branch" in text
    assert f"{states['checkpoints']:,} checkpoints taken" in text


def test_named_state_model_sets_the_bytes(trace, tmp_path):
    out = tmp_path / "out"
    argv = ["--layers-pattern", "FL", "--state-bytes", "qwen3-next-80b", "--out-dir", str(out)]
    assert main(["replay", trace, *argv, *FAST]) == 0
    assert json.loads((out / "replay.json").read_text())["states"]["state_bytes"] == 77_266_944


def test_sweep_over_patterns_and_state_slots_has_state_columns(trace, tmp_path, capsys):
    grid = "layers-pattern=FF,FSL,state-slots=40,80"
    assert main(["replay", trace, "--sweep", grid, "--out-dir", str(tmp_path), *FAST]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if "checkpoints" in line)
    assert "host states" in lines[header] and "state GB" in lines[header]
    rows = lines[header + 1 : header + 5]
    assert rows[0].split()[-4:] == ["-"] * 4 and rows[2].split()[-4] != "-"  # FF: no states
    runs = json.loads((tmp_path / "sweep.json").read_text())["runs"]
    assert [r["config"]["state_slots"] for r in runs] == [40, 80, 40, 80]
    assert [r["config"]["layers"] for r in runs] == [2, 2, 3, 3]
    assert runs[0]["states"] is None and runs[3]["states"]["device"]["slots"] == 80


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--layers-pattern", "FXL"], "--layers-pattern must be one or more of the letters"),
        (["--layers-pattern", "FSL", "--layers", "2"], "--layers-pattern FSL has 3 letters"),
        (
            ["--layers-pattern", "FL", "--storage", "memory", "--storage-tiering", "exclusive"],
            "--storage-tiering exclusive",
        ),
        (["--layers-pattern", "FL", "--tiering", "exclusive"], "--tiering exclusive"),
        (["--layers-pattern", "FL", "--state-bytes", "0"], "--state-bytes must be a positive"),
        (["--layers-pattern", "FL", "--state-bytes", "big"], "--state-bytes must be a positive"),
        (["--layers-pattern", "FL", "--state-slots", "3"], "--state-slots must be >= 34"),
        (["--layers-pattern", "FL", "--checkpoint", "end"], "--checkpoint must be finish"),
        (["--layers-pattern", "FL", "--checkpoint", "every:24"], "multiple of --page-size"),
        (["--layers-pattern", "FS", "--window", "0"], "--window must be a positive int"),
    ],
)
def test_misuse_is_one_error_line_naming_the_flag(trace, tmp_path, capsys, argv, flag):
    assert main(["replay", trace, *argv, "--out-dir", str(tmp_path), *FAST]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err
