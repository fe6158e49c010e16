"""``--sweep``: the grid's grammar, its points in table order, total capacity, and the table
and JSON of a storage x tiering sweep."""

import json

import pytest

from hicache.__main__ import main
from hicache.replay.config import ReplayConfig
from hicache.replay.sweep import grid_points, parse_sweep, sweep_configs, total_capacity

GEN = ["--sessions", "6", "--turns", "2", "--system-tokens", "512", "--turn-tokens", "256"]
FAST = ["--h2d-gbps", "10", "--d2h-gbps", "10", "--no-progress"]


def test_a_grid_of_several_names():
    grid = parse_sweep("device_tokens=4096,1024,storage-capacity=8192,tiering=exclusive,inclusive")
    assert grid == {
        "device-tokens": [1024, 4096],
        "storage-capacity": [8192],
        "tiering": ["exclusive", "inclusive"],
    }
    points = grid_points(grid)
    assert len(points) == 4 and points[0] == {
        "device-tokens": 1024,
        "storage-capacity": 8192,
        "tiering": "exclusive",
    }
    assert [p["tiering"] for p in points[:2]] == ["exclusive", "inclusive"]  # last is fastest


def test_configs_take_each_point():
    base = ReplayConfig(storage="memory")
    grid = parse_sweep("host-ratio=0.5,2,storage-tiering=inclusive,exclusive")
    configs = sweep_configs(base, grid_points(grid))
    assert [(c.host_ratio, c.storage_tiering) for c in configs] == [
        (0.5, "inclusive"),
        (0.5, "exclusive"),
        (2.0, "inclusive"),
        (2.0, "exclusive"),
    ]


def test_total_capacity_adds_every_tier():
    cfg = ReplayConfig(device_tokens=1000, host_ratio=2, page_size=16)
    assert total_capacity(cfg) == 1008 + 2016
    assert total_capacity(cfg.with_(storage="memory", storage_capacity=4096)) == 7120
    assert total_capacity(cfg.with_(storage="memory")) is None  # uncapped
    assert total_capacity(cfg.with_(host_ratio=0)) == 1008


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("layers=1,2", "--sweep names must be in"),
        ("1024,device-tokens=5", "--sweep must start with NAME="),
        ("device-tokens=1,device_tokens=2", "--sweep device-tokens: given twice"),
        ("device-tokens=", "--sweep device-tokens: give at least one value"),
        ("storage-capacity=1e4", "--sweep storage-capacity: values must be int"),
        ("tiering=inclusive,both", "values must be inclusive or exclusive"),
    ],
)
def test_bad_sweeps_name_the_flag(text, words):
    with pytest.raises(ValueError, match=words):
        parse_sweep(text)


def test_storage_and_tiering_sweep_table_and_json(tmp_path, capsys):
    trace, out = tmp_path / "g.jsonl", tmp_path / "out"
    gen = [*GEN[:2], "--turns", "3", "--turn-tokens", "512", "--output-tokens", "512"]
    main(["replay", "--generate", str(trace), "--generate-only", *gen, "--turn-gap-s", "30"])
    capsys.readouterr()
    argv = ["--device-tokens", "4096", "--host-ratio", "1.5", "--storage", "memory"]
    argv += ["--max-running", "2", "--load-back-threshold", "0"]
    sweep = "storage-capacity=4096,65536,tiering=inclusive,exclusive"
    code = main(["replay", str(trace), *argv, "--sweep", sweep, "--out-dir", str(out), *FAST])
    assert code == 0
    report = json.loads((out / "sweep.json").read_text())
    assert report["sweep"] == {
        "storage-capacity": [4096, 65536],
        "tiering": ["inclusive", "exclusive"],
    }
    runs = report["runs"]
    assert [(r["storage-capacity"], r["tiering"]) for r in runs] == [
        (4096, "inclusive"),
        (4096, "exclusive"),
        (65536, "inclusive"),
        (65536, "exclusive"),
    ]
    assert [r["total_capacity_tokens"] for r in runs] == [4096 + 6144 + 4096] * 2 + [
        4096 + 6144 + 65536
    ] * 2
    assert runs[2]["hit_rate"]["storage"] > 0 and runs[2]["storage"]["bytes_read"] > 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "storage %" in line)
    assert header.split()[:4] == ["storage-capacity", "tiering", "capacity", "device"]
    rows = [line.split() for line in lines if line.strip().startswith(("4096", "65536"))]
    assert [row[:3] for row in rows] == [
        ["4096", "inclusive", "14,336"],
        ["4096", "exclusive", "14,336"],
        ["65536", "inclusive", "75,776"],
        ["65536", "exclusive", "75,776"],
    ]
    assert float(rows[2][6]) == pytest.approx(runs[2]["hit_rate"]["total"], abs=0.05)
