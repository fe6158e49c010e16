"""``hicache bench --state-slots/--checkpoint/--state-bytes``: the flags reach the engine's
``CacheSpec``, a denser checkpoint policy holds more recurrent states, the report and
results.json count them; misuse exits with one line naming the flag."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from hicache.__main__ import main
from hicache.bench import BenchConfig, run_bench
from hicache.bench.model_flags import parse_checkpoint, spell_checkpoint, state_plan
from hicache.bench.runner import run_mode
from hicache.bench.states import format_states
from hicache.engine import CacheSpec, build_engine
from hicache.model import TinyTransformer
from hicache.radix import CheckpointPolicy
from tests.engine.helpers import TINY

HYBRID = {k: v for k, v in TINY.items() if k != "layers"} | {"layers_pattern": "FSLFSL"}


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("finish", CheckpointPolicy()),
        ("branch", CheckpointPolicy(at_finish=False, at_branch=True)),
        ("finish+branch", CheckpointPolicy(at_branch=True)),
        ("every:64", CheckpointPolicy(at_finish=False, every_tokens=64)),
        ("finish+every:8+branch", CheckpointPolicy(every_tokens=8, at_branch=True)),
    ],
)
def test_checkpoint_values_parse_and_spell_back(text: str, policy: CheckpointPolicy) -> None:
    assert parse_checkpoint(text) == policy
    assert parse_checkpoint(spell_checkpoint(policy)) == policy


def test_flags_reach_the_engines_cache_spec() -> None:
    cfg = BenchConfig.from_args({**HYBRID, "state_slots": 12, "checkpoint": "finish+every:8"})
    spec = cfg.cache_spec("hiradix")
    assert spec.state_slots == 12 and spec.checkpoint == CheckpointPolicy(every_tokens=8)
    engine = build_engine(TinyTransformer(cfg.model_config(), "cpu"), spec, cfg.engine_config())
    assert engine.cache.hybrid.checkpoint == spec.checkpoint
    assert engine.req_to_token_pool.mamba_pool.size == 12
    assert cfg.to_dict()["checkpoint"] == "finish+every:8"


def peak_states(checkpoint: str) -> int:
    """Device states held at peak by a device-only tiny run, prompts prefilled 8 at a time."""
    cfg = BenchConfig.from_args(
        {**HYBRID, "checkpoint": checkpoint, "max_prefill_tokens": 8, "users": 2, "rounds": 2}
    )
    model = TinyTransformer(cfg.model_config(), "cpu")
    summary = run_mode(model, cfg, "radix", "device-only", progress=False)["summary"]
    assert summary["states_stored"] >= summary["states_peak_device"] > 0
    return int(summary["states_peak_device"])


def test_every_n_tokens_holds_more_states_than_finish() -> None:
    assert peak_states("every:8") > peak_states("finish")


def test_report_and_results_count_states(tmp_path: Path) -> None:
    cfg = BenchConfig.from_args({**HYBRID, "state_bytes": 2**20, "out_dir": str(tmp_path)})
    out = io.StringIO()
    run_bench(cfg, progress=False, out=out)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["state_plan"] == {
        "state_slots": 6,
        "track_slots": 0,  # page 1: no decode tracking
        "checkpoint": "finish+branch",
    }
    host = saved["host-tier"]["summary"]
    assert host["states_peak_host"] >= host["states_end_host"] > 0
    assert host["states_backed_up"] >= host["states_loaded"] > 0
    assert saved["device-only"]["summary"]["states_peak_host"] == 0
    peak = host["states_peak_device"]
    line = next(x for x in out.getvalue().splitlines() if x.strip().startswith("host-tier:"))
    assert f"peak {peak} device ({peak:.1f} MiB)" in line
    assert f"{host['states_loaded']} restored from host" in line


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--checkpoint", "finish"], "--checkpoint sets the recurrent states"),
        (["--layers-pattern", "FSF", "--state-slots", "64"], "--state-slots sets the recurrent"),
        (["--layers-pattern", "FL", "--checkpoint", "end"], "--checkpoint must be finish, branch"),
        (["--layers-pattern", "FL", "--checkpoint", "every:0"], "--checkpoint every:N needs N"),
        (["--layers-pattern", "FL", "--page-size", "4", "--checkpoint", "every:6"], "--page-size"),
        (["--layers-pattern", "FL", "--max-running", "3", "--state-slots", "7"], ">= 8"),
        (["--layers-pattern", "FL", "--state-bytes", "0"], "--state-bytes must be positive"),
    ],
    ids=["no-pattern", "no-L", "bad-word", "zero", "page", "too-few", "bytes"],
)
def test_misuse_exits_with_one_line_naming_the_flag(
    extra: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["bench", *extra, "--device", "cpu", "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert words in err
    assert not (tmp_path / "out").exists()  # refused before any work


def test_the_plan_counts_decode_tracking_slots_past_page_one() -> None:
    """Pages over one token with ``finish``: two track slots per request row, in the plan and
    in the report's header; none without ``finish``."""
    spec = CacheSpec(page_size=16, device_tokens=512, max_requests=4)
    plan = state_plan(spec)
    assert plan["track_slots"] == 8
    summary = {"states_peak_device": 1, "states_end_device": 1, "states_stored": 1}
    summary |= {"states_evicted": 0, "state_hits": 0, "states_peak_host": 0, "states_backed_up": 0}
    assert "+ 8 decode-tracking slots" in format_states(plan, {"device-only": summary}, 2**20)
    branch_only = CacheSpec(page_size=16, checkpoint=CheckpointPolicy(False, None, True))
    assert state_plan(branch_only)["track_slots"] == 0
