"""``hicache bench --layers-pattern``: a hybrid model runs the multi-turn workload device-only
and with the host tier, which carries its SWA KV and recurrent states and adds host hits, and
with ``--storage`` (a fresh process served from the store); misuse exits with one line naming
the flag."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from hicache.__main__ import main
from hicache.bench import BenchConfig, run_bench, run_storage_bench
from tests.engine.helpers import TINY

HYBRID = {k: v for k, v in TINY.items() if k != "layers"} | {"layers_pattern": "FSLFSL"}


def test_pattern_sets_the_layer_count(tmp_path: Path) -> None:
    cfg = BenchConfig.from_args({**HYBRID, "out_dir": str(tmp_path)})
    assert cfg.layers == 6 and cfg.hybrid
    assert cfg.model_config().layer_kinds == "FSLFSL"
    full = BenchConfig.from_args({**TINY, "layers_pattern": "FF", "out_dir": str(tmp_path)})
    assert not full.hybrid and full.model_revision() != BenchConfig.from_args(TINY).model_revision()


def test_a_hybrid_pattern_takes_the_storage_tier(tmp_path: Path) -> None:
    cfg = BenchConfig.from_args({**HYBRID, "storage": "file", "out_dir": str(tmp_path)})
    storage = cfg.storage_config(str(tmp_path))
    assert cfg.hybrid and storage is not None and storage.backend == "file"


@pytest.mark.slow
def test_hybrid_storage_bench_serves_phase_two_from_storage(tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = {**HYBRID, "storage": "file", "page_size": 4, "prefetch_threshold": 8}
    cfg = BenchConfig.from_args({**args, "out_dir": str(tmp_path), "storage_dir": str(store)})
    results = run_storage_bench(cfg, progress=False, out=io.StringIO())
    cold, warm = results["cold"]["summary"], results["warm-storage"]["summary"]
    assert cold["rejected"] == warm["rejected"] == 0
    assert warm["storage_hit_tokens"] > 0 and warm["computed_tokens"] < cold["computed_tokens"]


def test_hybrid_bench_host_tier_adds_hits(tmp_path: Path) -> None:
    # The default tiny device pool (96 tokens) is short: later turns hit the host.
    cfg = BenchConfig.from_args({**HYBRID, "out_dir": str(tmp_path)})
    out = io.StringIO()
    results = run_bench(cfg, progress=False, out=out)
    base, host = results["device-only"]["summary"], results["host-tier"]["summary"]
    for summary in (base, host):
        assert summary["rejected"] == 0 and summary["requests"] == 9
    assert host["host_hit_rate"] > 0 and host["h2d_bytes"] > 0
    assert host["hit_rate"] > base["hit_rate"]
    assert host["computed_tokens"] < base["computed_tokens"]
    text = out.getvalue()
    assert "host tier vs device-only" in text and "6L FSLFSL" in text
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["config"]["layers_pattern"] == "FSLFSL" and "host-tier" in saved


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--layers-pattern", ""], "one or more of the letters F, S, L"),
        (["--layers-pattern", "FSX"], "one or more of the letters F, S, L"),
        (["--layers-pattern", "fsl"], "one or more of the letters F, S, L"),
        (["--layers-pattern", "FSL", "--layers", "4"], "has 3 letters, one per layer"),
    ],
    ids=["empty", "bad-letter", "lower-case", "length"],
)
def test_misuse_exits_with_one_line_naming_the_flag(
    extra: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["bench", *extra, "--device", "cpu", "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--layers-pattern" in err and words in err
    assert not (tmp_path / "out").exists()  # refused before any work


def test_a_non_string_pattern_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="--layers-pattern must be a str"):
        BenchConfig.from_args({**TINY, "layers_pattern": ["F", "F"]})
