"""CUDA-only: the engine's scheduler steps (prefill with a host hit, decode, finish: frees,
insert, backup issue) under ``torch.cuda.set_sync_debug_mode("error")``, the model's forward and
its logits' copy excluded. Skipped without a GPU. The steps are
``benchmarks/probes/sync_census.py``'s, which lists the syncs where this test fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "probes"))

import sync_census  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_scheduler_steps_do_not_sync_on_cuda() -> None:
    sync_census.scheduler_steps(sync_census.build("error"), "error")
