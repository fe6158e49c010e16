"""Storage warm restart for hybrid models: engine A (a file store in ``tmp_path``) serves a
first turn and drains it to storage; a NEW engine B over the same directory serves the second
turn from a storage hit (KV pages of every attention layer, the recurrent state at the end of
the first turn) with the logits of the same request computed cold."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hicache.backends import StorageConfig
from hicache.engine import CacheSpec, Engine, EngineConfig, build_engine
from hicache.model import TinyTransformer
from hicache.radix import HiCacheConfig
from tests.engine.test_engine_hybrid import ANSWER, FIRST, assert_pools_whole, serve
from tests.model.hybrid_harness import DEVICES, hybrid_config, random_prompt

CASES = [
    ("FSL", "mha", 1),
    ("FSL", "mha", 16),
    ("FSLFSL", "mha", 1),
    ("FSLFSL", "mha", 16),
    ("FSL", "mla", 16),
    ("FS", "mha", 16),
]
IDS = [f"{p}-{a}-page{ps}" for p, a, ps in CASES]


def storage_engine(
    root: Path | None, pattern: str, attention: str, page: int, device: str = "cpu"
) -> Engine:
    """A hybrid engine on ``device``: with a host tier and a file store under ``root``, or
    device-only (None: the cold reference)."""
    model = TinyTransformer(hybrid_config(pattern, attention), device)
    sizes = {"device_tokens": 512, "max_context_len": 256, "max_requests": 4, "page_size": page}
    if root is None:
        return build_engine(model, CacheSpec(**sizes), EngineConfig(record_logits=True))
    storage = StorageConfig(
        backend="file",
        extra_config={"root": str(root)},
        model_id="tiny-hybrid",
        prefetch_threshold=page,
        prefetch_policy="wait_complete",
    )
    hicache = HiCacheConfig(storage=storage, load_back_threshold=0)
    spec = CacheSpec(kind="hiradix", hicache=hicache, **sizes)
    return build_engine(model, spec, EngineConfig(record_logits=True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("pattern", "attention", "page"), CASES, ids=IDS)
def test_warm_restart_serves_the_second_turn_from_storage(
    tmp_path: Path, pattern: str, attention: str, page: int, device: str
) -> None:
    first_engine = storage_engine(tmp_path, pattern, attention, page, device)
    cfg = first_engine.model.cfg
    first = serve(first_engine, random_prompt(cfg, FIRST, 21), ANSWER)
    first_engine.cache.drain_transfers()
    first_engine.cache.close()
    fresh = storage_engine(tmp_path, pattern, attention, page, device)
    history = first.origin_input_ids + first.output_ids
    # Few new tokens: the logits still feel the restored state (a linear layer's decays).
    second = serve(fresh, history + random_prompt(cfg, 3, 22), 5)
    cached = FIRST + ANSWER - 1
    assert (second.device_hit, second.storage_hit) == (0, cached - cached % page)
    cold = serve(storage_engine(None, pattern, attention, page, device), second.origin_input_ids, 5)
    assert cold.device_hit == 0 and cold.output_ids == second.output_ids
    atol = 1e-5 if device == "cpu" else 1e-4
    logits = torch.stack(second.logits), torch.stack(cold.logits)
    torch.testing.assert_close(*logits, atol=atol, rtol=0)
    stats = fresh.cache.stats()
    assert stats.storage is not None and stats.storage.prefetch_loaded_tokens == second.storage_hit
    if "L" in pattern:
        assert stats.host_components.states_fetched == 1
    assert_pools_whole(fresh)
