"""The scripts in examples/ run as a user would run them and print what they promise."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_embed_example_loads_history_back_from_the_host_then_from_storage(capsys) -> None:
    runpy.run_path(str(EXAMPLES / "embed.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5
    assert lines[0].endswith("{'device': 0, 'host': 0, 'storage': 0, 'computed': 192}")
    assert lines[1].endswith("{'device': 128, 'host': 0, 'storage': 0, 'computed': 64}")
    assert lines[3].endswith("{'device': 128, 'host': 64, 'storage': 0, 'computed': 32}")
    assert lines[4].endswith("{'device': 0, 'host': 0, 'storage': 224, 'computed': 16}")


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_every_example_has_a_docstring_saying_how_to_run_it(script: str) -> None:
    assert f"python examples/{script}" in (EXAMPLES / script).read_text()
