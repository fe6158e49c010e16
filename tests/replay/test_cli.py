"""``hicache replay``: JSON and PNG written, sweeps, bad traces as one error line."""

import json

import pytest

from hicache.__main__ import main

GEN = ["--sessions", "6", "--turns", "2", "--system-tokens", "512", "--turn-tokens", "256"]
FAST = ["--h2d-gbps", "10", "--d2h-gbps", "10", "--no-progress"]


def test_generate_then_replay_writes_json_and_png(tmp_path, capsys):
    trace, out = tmp_path / "g.jsonl", tmp_path / "out"
    code = main(["replay", "--generate", str(trace), *GEN, "--out-dir", str(out), *FAST])
    assert code == 0 and trace.exists()
    report = json.loads((out / "replay.json").read_text())
    assert report["finished"] == 12 and report["tokens"]["storage"] == 0
    hit = report["hit_rate"]
    assert hit["total"] == pytest.approx(hit["ideal"]) and hit["ideal"] > 0
    assert set(report["modelled"]) == {
        "ttft_ms",
        "makespan_s",
        "throughput",
        "load",
        "queueing_dominates",
    }
    assert "memory" in report["measured"] and report["memory"]["peak_rss_gb"] > 0
    assert (out / "replay.png").stat().st_size > 0
    text = capsys.readouterr().out
    assert "measured (" in text and "modelled (" in text and "(not built)" in text
    assert "reachable ideal: the last prompt token is never matched" in text
    assert report["hit_rule"] in text and report["block_rule"] in text


def test_storage_replay_reports_storage_hits_and_traffic(tmp_path, capsys):
    trace, out = tmp_path / "g.jsonl", tmp_path / "out"
    gen = [*GEN[:2], "--turns", "3", "--turn-tokens", "512", "--output-tokens", "512"]
    main(["replay", "--generate", str(trace), "--generate-only", *gen, "--turn-gap-s", "30"])
    argv = ["--device-tokens", "4096", "--host-ratio", "1.5", "--max-running", "2"]
    argv += ["--storage", "file", "--storage-capacity", "65536", "--storage-gbps", "2"]
    argv += ["--tiering", "exclusive", "--load-back-threshold", "0"]
    assert main(["replay", str(trace), *argv, "--out-dir", str(out), *FAST]) == 0
    report = json.loads((out / "replay.json").read_text())
    tokens, hit, storage = report["tokens"], report["hit_rate"], report["storage"]
    assert tokens["storage"] > 0 and hit["storage"] > 0
    assert storage["backend"] == "file" and storage["capacity_tokens"] == 65536
    assert storage["bytes_read"] == tokens["storage"] * report["transfers"]["token_bytes"]
    assert storage["read_gb_s"] > 0 and storage["bytes_written"] > 0
    assert report["cost_model"]["storage_gb_s"] == 2.0
    assert report["tierings"] == {"host": "exclusive", "storage": "inclusive"}
    assert hit["block_ideal"] >= hit["ideal"] > 0 and "storage" in report["measured"]
    text = capsys.readouterr().out
    assert "storage file 65,536 tokens (inclusive)" in text and "host x1.5 (exclusive)" in text
    assert "  storage       file, 65,536 tokens: read " in text and "(not built)" not in text
    assert "storage reads at 2 GB/s" in text


def test_sweep_orders_capacities_and_plots(tmp_path, capsys):
    trace, out = tmp_path / "g.jsonl", tmp_path / "out"
    main(["replay", "--generate", str(trace), "--generate-only", *GEN])
    sweep = "device-tokens=8192,2048"
    code = main(["replay", str(trace), "--sweep", sweep, "--out-dir", str(out), *FAST])
    runs = json.loads((out / "sweep.json").read_text())["runs"]
    assert code == 0 and [r["device-tokens"] for r in runs] == [2048, 8192]
    assert runs[0]["hit_rate"]["device"] <= runs[1]["hit_rate"]["device"]
    assert (out / "sweep.png").stat().st_size > 0


def test_preset_with_flags_over_it(tmp_path, capsys):
    trace = tmp_path / "long.jsonl"
    argv = ["replay", "--generate", str(trace), "--preset", "long-prompt", "--sessions", "2"]
    assert main([*argv, "--generate-only"]) == 0
    lengths = [json.loads(line)["input_length"] for line in trace.read_text().splitlines()]
    assert len(lengths) == 8 and min(lengths) == 10_880
    assert main(["replay", str(trace), "--preset", "long-prompt"]) == 2
    assert "--preset needs --generate OUT" in capsys.readouterr().err


def test_bad_line_is_one_error_line_or_skipped(tmp_path, capsys):
    trace = tmp_path / "bad.jsonl"
    good = {"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}
    trace.write_text(json.dumps(good) + "\n" + '{"timestamp": 1}\n')
    out = ["--out-dir", str(tmp_path / "o"), *FAST]
    assert main(["replay", str(trace), *out]) == 2
    assert "bad.jsonl:2: 'input_length' must be an int" in capsys.readouterr().err
    assert main(["replay", str(trace), "--skip-bad", *out]) == 0
    assert "1 bad line(s) skipped" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--sweep", "layers=1,2"], "--sweep names must be in"),
        (["--sweep", "host-ratio=x"], "values must be float"),
        (["--sweep", "tiering=both"], "values must be inclusive or exclusive"),
        (["--sweep", "storage-capacity=4096"], "storage_capacity needs a storage tier"),
        (["--storage-capacity", "4096"], "storage_capacity needs a storage tier"),
        (["--storage-tiering", "exclusive"], "storage_tiering needs a storage tier"),
        (["--storage", "memory", "--host-ratio", "0"], "storage='memory' needs a host tier"),
        (["--storage", "memory", "--storage-capacity", "8"], "storage_capacity must be >= 16"),
        (["--tiering", "exclusive", "--host-ratio", "0"], "tiering needs a host tier"),
        (["--storage", "file", "--storage-gbps", "0"], "storage_gbps must be > 0"),
        (["--host-ratio", "-0.5"], "host_ratio"),
        (["--limit", "0"], "--limit must be positive"),
    ],
)
def test_bad_options_exit_2(tmp_path, capsys, argv, words):
    trace = tmp_path / "g.jsonl"
    main(["replay", "--generate", str(trace), "--generate-only", *GEN])
    assert main(["replay", str(trace), "--out-dir", str(tmp_path / "o"), *argv]) == 2
    assert words in capsys.readouterr().err
