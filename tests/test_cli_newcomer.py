"""What a newcomer types first: bad options are one ``error:`` line and exit 2, and every
command's --help names its defaults."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import fields

import pytest

from hicache.__main__ import main
from hicache.replay.generate import GenerateSpec
from hicache.replay.options import GENERATE_OPTIONS
from hicache.stress.__main__ import main as stress_main


def _one_error_line(err: str, prog: str, words: str) -> None:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: ") and words in lines[0], err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--ops", "-5"], "--ops: must be >= 1, got -5"),
        (["--faults", "2"], "--faults: must be in [0, 1), got 2.0"),
        (["--full-every", "0"], "--full-every: must be >= 1"),
        (["--max-seconds", "0"], "--max-seconds: must be > 0"),
        (["--device", "nowhere"], "--device: not a device"),
        (["--page-sizes", "0"], "--page-sizes: page_size must be >= 1"),
        (["--only", "nonexistent"], "--only: no scenario label contains 'nonexistent'"),
    ],
)
def test_stress_bad_options_exit_2_with_one_line(capsys, argv, words):
    with pytest.raises(SystemExit) as exit_:
        stress_main(argv)
    assert exit_.value.code == 2
    _one_error_line(capsys.readouterr().err, "python -m hicache.stress", words)


@pytest.mark.skipif(importlib.util.find_spec("mooncake") is not None, reason="extra installed")
def test_bench_mooncake_without_the_extra_names_it(capsys):
    assert main(["bench", "--storage", "mooncake", "--mooncake-master", "127.0.0.1:1"]) == 2
    _one_error_line(capsys.readouterr().err, "hicache bench", "pip install 'hicache[mooncake]'")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-m", "hicache", "replay", "--help"], ["(default 1048576)", "(default: 64)"]),
        (["-m", "hicache", "selfcheck", "--help"], ["(default: 4096)", "KV layers"]),
        (["-m", "hicache.stress", "--help"], ["(default: 2000)", "(default: [1, 64])"]),
        (["-m", "hicache", "bench", "--help"], ["(default: warning)"]),
    ],
    ids=["replay", "selfcheck", "stress", "bench"],
)
def test_help_shows_defaults_and_no_placeholder(argv, expected):
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, check=True)
    text = " ".join(done.stdout.split())
    assert all(e in text for e in expected), text
    assert "generator " not in text and "(default: None)" not in text


def test_every_generator_field_has_an_option_with_help():
    assert set(GENERATE_OPTIONS) == {f.name for f in fields(GenerateSpec)} - {"block_tokens"}
