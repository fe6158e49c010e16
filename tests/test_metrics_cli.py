"""``--metrics-port`` / ``--metrics-host`` on ``hicache bench`` and ``hicache replay``: parsed,
checked before any work, and serving the running cache (scraped mid-run)."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from hicache.__main__ import build_parser, main
from hicache.bench import BenchConfig, runner
from hicache.model import TinyTransformer, TPShard
from hicache.replay.config import ReplayConfig
from hicache.replay.runner import replay
from tests.engine.helpers import TINY
from tests.replay.chat import FAST, chat_trace

pytest.importorskip("prometheus_client")
URL = re.compile(r"metrics: (http://\S+/metrics) \((.*)\)")


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


@pytest.mark.parametrize(("command", "config"), [("bench", BenchConfig), ("replay", ReplayConfig)])
def test_flags_parse_into_the_config(command: str, config: Any) -> None:
    args = vars(build_parser().parse_args([command, "--metrics-port", "9400"]))
    cfg = config.from_args(args)
    assert (cfg.metrics_port, cfg.metrics_host) == (9400, "127.0.0.1")
    args = vars(build_parser().parse_args([command, "--metrics-host", "0.0.0.0"]))
    assert config.from_args(args).metrics_host == "0.0.0.0"
    assert config.from_args(args).metrics_port is None  # default: no server


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["bench", "--metrics-port", "-1"], "metrics port"),
        (["bench", "--metrics-port", "0", "--tp", "2"], "--tp"),
        (["replay", "--generate", "{tmp}/t.jsonl", "--metrics-port", "65536"], "metrics port"),
    ],
)
def test_bad_metrics_flags_exit_2_with_one_line(argv, words, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code = main([*argv, "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and words in err and "Traceback" not in err
    assert not (tmp_path / "out" / "replay.json").exists()


def test_replay_serves_the_replayed_cache_while_it_runs(capsys) -> None:  # type: ignore[no-untyped-def]
    scraped: list[str] = []

    def on_record(_record: Any) -> None:
        if not scraped:
            found = URL.search(capsys.readouterr().err)
            assert found is not None and found.group(2).startswith("replay")
            scraped.append(_scrape(found.group(1)))

    cfg = ReplayConfig(device_tokens=2048, page_size=16, metrics_port=0, **FAST)
    replay(chat_trace(), cfg, on_record)
    assert scraped and "hicache_match_calls_total" in scraped[0]
    assert 'hicache_transfer_duration_seconds_bucket{direction="h2d"' in scraped[0]


def test_bench_serves_each_measured_run(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    drive, scraped = runner.drive, {}

    def drive_and_scrape(*args: Any) -> Any:
        out = drive(*args)
        found = URL.search(capsys.readouterr().err)
        assert found is not None
        scraped[found.group(2)] = _scrape(found.group(1))
        return out

    monkeypatch.setattr(runner, "drive", drive_and_scrape)
    cfg = BenchConfig.from_args({**TINY, "out_dir": str(tmp_path), "metrics_port": 0})
    model = TinyTransformer(cfg.model_config(), cfg.device, TPShard.of(None))
    for label, kind in runner.MODES.items():
        runner.run_mode(model, cfg, kind, label, progress=False)
    assert set(scraped) == {"device-only", "host-tier"}
    host_run = scraped["host-tier"]
    assert 'hicache_eviction_duration_seconds_count{run="host-tier",tier="device"}' in host_run
    assert 'hicache_usage_ratio{run="host-tier",tier="host"}' in host_run
    assert "hicache_transfer_duration" not in scraped["device-only"]
