"""What each TP rank runs in the hybrid TP test (module level: the launcher pickles it by name)."""

from __future__ import annotations

from typing import Any

import torch

from hicache.engine import build_engine
from hicache.model import ModelConfig, TinyTransformer, TPShard
from hicache.tp import TPGroup
from tests.tp_engine.ranks import ENGINE, SPEC, run_chat

HYBRID = ModelConfig(
    attention="mha",
    num_heads=4,
    num_kv_heads=2,
    num_layers=3,
    layer_pattern="FSL",
    sliding_window=8,
    seed=7,
)


def hybrid_checks(group: Any) -> dict[str, Any]:
    """The test chat on a hybrid model over the host tier, on this rank's shard."""
    torch.set_num_threads(1)
    model = TinyTransformer(HYBRID, "cpu", TPShard.of(group))
    engine = build_engine(model, SPEC, ENGINE, tp_group=TPGroup(group, debug=True))
    out = run_chat(engine)
    engine.cache.check_invariants()
    out["states loaded"] = engine.cache.stats().host_components.states_loaded
    return out
