"""``hicache bench --layers-pattern``: a hybrid model runs the multi-turn workload device-only
(the host-tier run skipped, saying why) and reuses its prefixes; misuse exits with one line
naming the flag."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from hicache.__main__ import main
from hicache.bench import BenchConfig, run_bench
from hicache.bench.runner import HYBRID_SKIP
from tests.engine.helpers import TINY

HYBRID = {k: v for k, v in TINY.items() if k != "layers"} | {"layers_pattern": "FSLFSL"}


def test_pattern_sets_the_layer_count(tmp_path: Path) -> None:
    cfg = BenchConfig.from_args({**HYBRID, "out_dir": str(tmp_path)})
    assert cfg.layers == 6 and cfg.hybrid
    assert cfg.model_config().layer_kinds == "FSLFSL"
    full = BenchConfig.from_args({**TINY, "layers_pattern": "FF", "out_dir": str(tmp_path)})
    assert not full.hybrid and full.model_revision() != BenchConfig.from_args(TINY).model_revision()


def test_hybrid_bench_runs_device_only_and_hits(tmp_path: Path) -> None:
    # A device pool that holds every conversation, so later turns hit their earlier ones.
    cfg = BenchConfig.from_args({**HYBRID, "device_tokens": 1024, "out_dir": str(tmp_path)})
    out = io.StringIO()
    results = run_bench(cfg, progress=False, out=out)
    assert "host-tier" not in results
    summary = results["device-only"]["summary"]
    assert summary["rejected"] == 0 and summary["requests"] == 9
    assert summary["hit_rate"] > 0 and summary["reused_tokens"] > 0
    text = out.getvalue()
    assert f"host-tier run skipped for --layers-pattern FSLFSL: {HYBRID_SKIP}" in text
    assert f"prefill tokens saved {summary['reused_tokens']:,} of" in text
    assert "6L FSLFSL" in text
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["config"]["layers_pattern"] == "FSLFSL" and "host-tier" not in saved


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--layers-pattern", ""], "one or more of the letters F, S, L"),
        (["--layers-pattern", "FSX"], "one or more of the letters F, S, L"),
        (["--layers-pattern", "fsl"], "one or more of the letters F, S, L"),
        (["--layers-pattern", "FSL", "--layers", "4"], "has 3 letters, one per layer"),
        (["--layers-pattern", "FSL", "--storage", "file"], "not built yet"),
    ],
    ids=["empty", "bad-letter", "lower-case", "length", "storage"],
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
