"""``hicache bench --tp N``: argument checks, a small end-to-end run on 2 ranks (one launch)
against one rank, and the failure when ranks disagree."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

import hicache.bench.tp_run as tp_run
from hicache.__main__ import main
from hicache.bench import BenchConfig, run_bench, run_storage_bench
from hicache.bench.storage_run import PHASES
from hicache.bench.tp_run import TPMismatch, check_same_hits
from tests.bench.test_storage_bench import TINY_STORAGE
from tests.engine.helpers import TINY

MODES = ["device-only", "host-tier"]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tiny bench on one rank: the reference for the TP runs."""
    out_dir = str(tmp_path_factory.mktemp("one"))
    return run_bench(BenchConfig.from_args({**TINY, "out_dir": out_dir}), False, io.StringIO())


def argv(**extra: object) -> list[str]:
    opts = {**TINY, **extra}
    return ["bench", *(f"--{k.replace('_', '-')}={v}" for k, v in opts.items()), "--no-progress"]


@pytest.mark.parametrize(
    "extra, names",
    [
        ({"tp": 0}, ["--tp"]),
        ({"tp": -2}, ["--tp"]),
        ({"tp": 3}, ["--heads", "--tp"]),
        ({"tp": 2, "kv_heads": 1}, ["--kv-heads", "--tp"]),
        ({"tp": 2, "intermediate": 33}, ["--intermediate", "--tp"]),
        ({"tp": 4, "attention": "mla", "heads": 6}, ["--heads", "--tp"]),
    ],
)
def test_bad_tp_exits_2_naming_the_argument(
    extra: dict, names: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv(**extra, out_dir=tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(n in err for n in names), err
    with pytest.raises(ValueError, match=names[0]):
        BenchConfig.from_args({**TINY, **extra})


def test_mla_needs_no_kv_head_split() -> None:
    assert BenchConfig.from_args({**TINY, "tp": 2, "attention": "mla", "kv_heads": 1}).tp == 2


def test_bench_tp2_reports_rank0_and_matches_one_rank(
    one_rank: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv(tp=2, out_dir=tmp_path / "tp2")) == 0
    out = capsys.readouterr().out
    assert (
        "TP 2 ranks" in out
        and "TP: 2 ranks on cpu, cpu (gloo); every rank saw these hit rates" in out
    )
    tp2 = json.loads((tmp_path / "tp2" / "results.json").read_text())
    assert tp2["config"]["tp"] == 2
    for mode in MODES:
        want, got = tp_run.figures(one_rank[mode]), tp_run.figures(tp2[mode])
        assert got == want, mode
    assert one_rank["host-tier"]["summary"]["host_hit_rate"] > 0


def test_storage_bench_tp2_serves_phase_two_from_storage(tmp_path: Path) -> None:
    """Both phases, each a fresh set of rank processes, over one file store: every rank stores
    and reads its own shard's pages, and the ranks saw the same hits (``run_tp`` checked).
    Hits are not compared with one rank: with a storage tier they depend on I/O timing."""
    args = {**TINY_STORAGE, "tp": 2, "out_dir": str(tmp_path), "storage_dir": str(tmp_path / "s")}
    out = io.StringIO()
    results = run_storage_bench(BenchConfig.from_args(args), False, out)
    assert (
        "TP 2 ranks" in out.getvalue()
        and "TP: 2 ranks on cpu, cpu (gloo); every rank saw" in out.getvalue()
    )
    warm = results["warm-storage"]["summary"]
    assert warm["storage_hit_rate"] > 0 and warm["storage_hit_tokens"] > 0
    assert results["cold"]["summary"]["storage_backup_pages"] > 0
    runs = TINY["users"] * TINY["rounds"]
    assert [results[p]["summary"]["requests"] for p in PHASES] == [runs] * len(PHASES)


def test_ranks_that_disagree_fail_the_run(
    one_rank: dict,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = one_rank
    other = json.loads(json.dumps(run))
    other["host-tier"]["rounds"][1]["host_hit_rate"] += 1.0
    with pytest.raises(TPMismatch, match="host-tier round 2 host_hit_rate: rank 0 .*, rank 1"):
        check_same_hits([run, other], MODES)
    check_same_hits([run, json.loads(json.dumps(run))], MODES)

    monkeypatch.setattr(tp_run, "run_ranks", lambda *args, **kwargs: [run, other])
    assert main(argv(tp=2, out_dir=tmp_path / "bad")) == 1
    err = capsys.readouterr().err
    assert "different hits" in err and not (tmp_path / "bad" / "results.json").exists()
