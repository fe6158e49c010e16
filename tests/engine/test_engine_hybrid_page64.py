"""Page 64: a hybrid model's second turn served from a device hit, a host hit and a storage hit
(a fresh engine over the same file store) gives the logits of the same request computed cold,
for every pattern with a window or linear layer, MHA and MLA. The first turn (100 + 40 tokens)
ends mid-page: the tree keeps 128 tokens and, for a linear layer, the state the engine tracked
there during decode."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.test_engine_hybrid import (
    assert_equals_cold,
    assert_pools_whole,
    engine,
    serve,
    to_host,
)
from tests.engine.test_engine_hybrid_storage import storage_engine
from tests.model.hybrid_harness import random_prompt

CASES = [(p, a) for p in ("FSL", "FSLFSL", "FL", "FS") for a in ("mha", "mla")]
PAGE, PROMPT, ANSWER, KEPT = 64, 100, 40, 128  # the first turn's KV ends at 139: 2 pages kept


@pytest.mark.parametrize("tier", ["device", "host", "storage"])
@pytest.mark.parametrize(("pattern", "attention"), CASES, ids=[f"{p}-{a}" for p, a in CASES])
def test_page_64_second_turn_equals_cold(
    tmp_path: Path, tier: str, pattern: str, attention: str
) -> None:
    if tier == "storage":
        eng = storage_engine(tmp_path, pattern, attention, PAGE)
    else:
        eng = engine(pattern, attention, PAGE, kind="radix" if tier == "device" else "hiradix")
    cfg = eng.model.cfg
    first = serve(eng, random_prompt(cfg, PROMPT, 51), ANSWER)
    assert first.mamba_last_track_seqlen == (KEPT if "L" in pattern else None)
    if tier == "host":
        to_host(eng)
    if tier == "storage":
        eng.cache.drain_transfers()
        eng.cache.close()
        eng = storage_engine(tmp_path, pattern, attention, PAGE)
    second = serve(eng, first.origin_input_ids + first.output_ids + random_prompt(cfg, 3, 52), 5)
    hits = {"device": second.device_hit, "host": second.host_hit, "storage": second.storage_hit}
    assert hits[tier] == KEPT == second.device_hit + second.host_hit + second.storage_hit
    assert_equals_cold(eng, second)
    assert_pools_whole(eng)
