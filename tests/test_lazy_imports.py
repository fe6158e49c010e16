"""`import hicache` and `hicache --help` load no Triton: a kernel imports it when it runs."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "code",
    [
        "import hicache",
        "import hicache.__main__ as m\ntry:\n    m.main(['--help'])\nexcept SystemExit:\n    pass",
        "import hicache.stress.__main__, hicache.selfcheck, hicache.replay.cli",
    ],
    ids=["import", "help", "commands"],
)
def test_no_triton_until_a_kernel_runs(code: str) -> None:
    probe = "import sys\n" + code + "\nassert 'triton' not in sys.modules, 'triton imported'"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
