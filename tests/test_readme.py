"""The README's python blocks marked ``<!-- runnable ... -->`` run as shown, on the CPU."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
RUNNABLE = re.compile(r"<!-- runnable[^>]*-->\n```python\n(.*?)```", re.S)
BLOCKS = RUNNABLE.findall(README.read_text())


def test_the_readme_marks_its_runnable_blocks():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_runnable_block_runs(code: str, tmp_path: Path) -> None:
    root = str(README.parent)
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
