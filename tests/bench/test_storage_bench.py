"""``hicache bench --storage``: argument checks, and a tiny run whose second phase, in a fresh
process, is served from the file store."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from hicache.__main__ import main
from hicache.bench import BenchConfig, run_storage_bench
from hicache.bench.storage_run import PHASES
from tests.engine.helpers import TINY

# Pages of 4 tokens and a threshold of 8, so the tiny chats' prefixes are worth a prefetch.
TINY_STORAGE = {**TINY, "storage": "file", "page_size": 4, "prefetch_threshold": 8}


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--storage", "memory"],
        ["bench", "--storage-dir", "x"],
        ["bench", "--storage", "file", "--mooncake-master", "127.0.0.1:50051"],
        ["bench", "--storage", "mooncake", "--storage-dir", "x"],
        ["bench", "--storage", "file", "--prefetch-threshold", "0"],
        ["bench", "--storage", "file", "--prefetch-policy", "eager"],
    ],
)
def test_bad_storage_arguments_exit_with_one_line(argv: list[str], tmp_path: Path, capsys) -> None:
    try:
        code = main([*argv, "--out-dir", str(tmp_path)])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_storage_config_names_the_model_and_the_store(tmp_path: Path) -> None:
    cfg = BenchConfig.from_args({**TINY_STORAGE, "out_dir": str(tmp_path)})
    storage = cfg.storage_config(str(tmp_path))
    assert storage is not None and storage.backend == "file"
    assert storage.extra_config == {"root": str(tmp_path)} and storage.prefetch_threshold == 8
    other = BenchConfig.from_args({**TINY_STORAGE, "seed": 1, "out_dir": str(tmp_path)})
    assert storage.model_id == other.storage_config().model_id == "hicache-tiny"  # type: ignore[union-attr]
    assert storage.model_revision != other.storage_config().model_revision  # type: ignore[union-attr]
    assert BenchConfig.from_args({**TINY, "out_dir": str(tmp_path)}).storage_config() is None
    assert BenchConfig.from_args({"storage": "file", "device": "cpu"}).page_size == 64


def test_tiny_storage_bench_serves_phase_two_from_storage(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cfg = BenchConfig.from_args(
        {**TINY_STORAGE, "out_dir": str(tmp_path), "storage_dir": str(store)}
    )
    out = io.StringIO()
    (tmp_path / "rounds.png").write_bytes(b"an earlier run's plot")
    results = run_storage_bench(cfg, progress=False, out=out)
    assert not (tmp_path / "rounds.png").exists(), "a stale plot beside the new results"
    runs = TINY["users"] * TINY["rounds"]
    cold, warm, host = (results[p]["summary"] for p in PHASES)
    assert all(s["requests"] == runs and s["rejected"] == 0 for s in (cold, warm, host))
    assert cold["storage_hit_tokens"] == 0 and cold["storage_bytes_written"] > 0
    assert cold["storage_backup_pages"] > 0 and cold["storage_bytes_read"] == 0
    assert warm["storage_hit_tokens"] > 0 and warm["storage_bytes_read"] > 0
    assert warm["storage_hit_pages"] > 0 and warm["computed_tokens"] < cold["computed_tokens"]
    assert warm["hit_rate"] == pytest.approx(
        warm["device_hit_rate"] + warm["host_hit_rate"] + warm["storage_hit_rate"]
    )
    assert host["storage_hit_tokens"] == 0 and host["hit_rate"] > cold["hit_rate"]
    for s in (cold, warm, host):
        assert 0 < s["ttft_p50_ms"] <= s["ttft_p90_ms"] and s["ttft_mean_ms"] > 0
    assert any(store.rglob("*.bin")), "the file store holds the pages after the run"
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["warm-storage"]["summary"]["storage_hit_tokens"] == warm["storage_hit_tokens"]
    assert saved["storage"]["cache_salt"] == results["storage"]["cache_salt"]
    table = out.getvalue()
    assert table.index("metric") < table.index("warm from storage vs cold")  # as plain bench
    for row in ("hit rate: storage (L3)", "TTFT p90 (ms)", "storage read (GB/s)", "warm-host"):
        assert row in table, row


@pytest.mark.slow
def test_a_second_run_over_the_same_store_starts_cold(tmp_path: Path) -> None:
    """Each run salts its requests afresh: phase 1 never reads an earlier run's pages."""
    store = tmp_path / "store"
    cfg = BenchConfig.from_args(
        {**TINY_STORAGE, "rounds": 1, "out_dir": str(tmp_path), "storage_dir": str(store)}
    )
    first = run_storage_bench(cfg, progress=False, out=io.StringIO())
    second = run_storage_bench(cfg, progress=False, out=io.StringIO())
    assert first["storage"]["cache_salt"] != second["storage"]["cache_salt"]
    assert second["cold"]["summary"]["storage_bytes_read"] == 0
    assert second["warm-storage"]["summary"]["storage_hit_tokens"] > 0
