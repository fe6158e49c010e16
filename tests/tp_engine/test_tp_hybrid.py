"""A hybrid model (FSL) on 2 TP ranks with the host tier: every rank takes the same decisions
(the tree digests agree each step) and serves the tokens, hits and logits of one rank."""

from __future__ import annotations

import numpy as np
import torch

from hicache.engine import build_engine
from hicache.model import TinyTransformer
from hicache.tp import run_ranks
from tests.tp_engine import hybrid_ranks
from tests.tp_engine.ranks import ENGINE, SPEC, run_chat
from tests.tp_engine.test_tp_engine import TOL


def test_hybrid_tp_run_matches_one_rank() -> None:
    tp2 = run_ranks(hybrid_ranks.hybrid_checks, 2, timeout_s=120)
    torch.set_num_threads(1)
    want = run_chat(build_engine(TinyTransformer(hybrid_ranks.HYBRID), SPEC, ENGINE))
    assert sum(h[1] for h in want["hits"]) > 0, "host hits"
    assert all(out["states loaded"] > 0 for out in tp2)
    for out in tp2:
        assert out["tokens"] == want["tokens"] and out["hits"] == want["hits"]
        for a, b in zip(out["logits"], want["logits"], strict=True):
            assert float(np.abs(a - b).max()) <= TOL
