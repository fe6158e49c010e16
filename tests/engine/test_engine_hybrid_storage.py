"""Storage warm restart for hybrid models: engine A (a file store in ``tmp_path``) serves a
first turn and drains it to storage; a NEW engine B over the same directory serves the second
turn from a storage hit (KV pages of every attention layer, the recurrent state at the end of
the first turn) with the logits of the same request computed cold."""

from __future__ import annotations

from pathlib import Path

import pytest

from hicache.backends import StorageConfig
from hicache.engine import Engine
from hicache.radix import HiCacheConfig
from tests.engine.test_engine_hybrid import (
    ANSWER,
    FIRST,
    assert_equals_cold,
    assert_pools_whole,
    engine,
    serve,
)
from tests.model.hybrid_harness import random_prompt

CASES = [
    ("FSL", "mha", 1),
    ("FSL", "mha", 16),
    ("FSLFSL", "mha", 1),
    ("FSLFSL", "mha", 16),
    ("FSL", "mla", 16),
    ("FS", "mha", 16),
]
IDS = [f"{p}-{a}-page{ps}" for p, a, ps in CASES]


def storage_engine(root: Path, pattern: str, attention: str, page: int) -> Engine:
    """A hybrid engine with a host tier and a file store under ``root``."""
    storage = StorageConfig(
        backend="file",
        extra_config={"root": str(root)},
        model_id="tiny-hybrid",
        prefetch_threshold=page,
        prefetch_policy="wait_complete",
    )
    hicache = HiCacheConfig(storage=storage, load_back_threshold=0)
    return engine(pattern, attention, page, kind="hiradix", hicache=hicache)


@pytest.mark.parametrize(("pattern", "attention", "page"), CASES, ids=IDS)
def test_warm_restart_serves_the_second_turn_from_storage(
    tmp_path: Path, pattern: str, attention: str, page: int
) -> None:
    first_engine = storage_engine(tmp_path, pattern, attention, page)
    cfg = first_engine.model.cfg
    first = serve(first_engine, random_prompt(cfg, FIRST, 21), ANSWER)
    first_engine.cache.drain_transfers()
    first_engine.cache.close()
    fresh = storage_engine(tmp_path, pattern, attention, page)
    history = first.origin_input_ids + first.output_ids
    # Few new tokens: the logits still feel the restored state (a linear layer's decays).
    second = serve(fresh, history + random_prompt(cfg, 3, 22), 5)
    cached = FIRST + ANSWER - 1
    assert (second.device_hit, second.storage_hit) == (0, cached - cached % page)
    assert_equals_cold(fresh, second)
    stats = fresh.cache.stats()
    assert stats.storage is not None and stats.storage.prefetch_loaded_tokens == second.storage_hit
    if "L" in pattern:
        assert stats.host_components.states_fetched == 1
    assert_pools_whole(fresh)
