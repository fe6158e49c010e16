"""``hicache bench`` under SGLang bench_multiturn's names (the same fields, the same run)."""

import pytest

from hicache.__main__ import build_parser
from hicache.bench import BenchConfig
from hicache.bench.workload import ChatWorkload

SGLANG = ["--num-clients", "5", "--num-rounds", "3", "--request-length", "40"]
SGLANG += ["--output-length", "4", "--max-parallel", "2", "--request-rate", "8"]


def _config(argv):
    args = vars(build_parser().parse_args(["bench", "--device", "cpu", *argv]))
    return BenchConfig.from_args(args)


def test_sglang_names_fill_our_fields():
    cfg = _config([*SGLANG, "--distribution", "poisson"])
    assert (cfg.users, cfg.rounds, cfg.prompt_len, cfg.answer_len) == (5, 3, 40, 4)
    assert (cfg.max_running, cfg.arrival_rate, cfg.arrival_distribution) == (2, 8.0, "poisson")
    assert cfg == _config(
        [
            "--users",
            "5",
            "--rounds",
            "3",
            "--prompt-len",
            "40",
            "--answer-len",
            "4",
            "--max-running",
            "2",
            "--arrival-rate",
            "8",
            "--distribution",
            "poisson",
        ]
    )


def test_poisson_first_turns_are_seeded_with_the_rate_as_mean():
    cfg = _config(["--num-clients", "2000", "--request-rate", "10", "--distribution", "poisson"])
    times = [t for t, _, _ in ChatWorkload(cfg).first_arrivals(0.0)]
    assert times == [t for t, _, _ in ChatWorkload(cfg).first_arrivals(0.0)]
    assert times == sorted(times) and times[-1] / 1999 == pytest.approx(0.1, rel=0.1)
    uniform = [t for t, _, _ in ChatWorkload(_config(SGLANG)).first_arrivals(0.0)]
    assert uniform == pytest.approx([u / 8 for u in range(5)])


def test_unknown_distribution_is_refused():
    with pytest.raises(ValueError, match="--distribution must be one of"):
        BenchConfig(**{**_config(SGLANG).to_dict(), "arrival_distribution": "gamma"})
