"""The engine serves hybrid models from the host tier (``HybridHiRadixCache``): a request whose
prefix was evicted to the host loads its full and SWA KV and its recurrent state back and gives
the logits of the same request computed cold, for every layer pattern, MHA and MLA, pages of 1
and 16; the host copy keeps SWA KV the device tombstoned after the backup."""

from __future__ import annotations

import pytest

from hicache.tiers.hybrid_hiradix_cache import HybridHiRadixCache
from tests.engine.test_engine_hybrid import (
    ANSWER,
    FIRST,
    assert_equals_cold,
    assert_pools_whole,
    engine,
    serve,
    to_host,
)
from tests.model.hybrid_harness import random_prompt

CASES = [
    (p, a, ps) for p in ("FSL", "FSLFSL", "FL", "FS") for a in ("mha", "mla") for ps in (1, 16)
]
IDS = [f"{p}-{a}-page{ps}" for p, a, ps in CASES]


@pytest.mark.parametrize(("pattern", "attention", "page"), CASES, ids=IDS)
def test_multi_turn_host_hit_equals_cold(pattern: str, attention: str, page: int) -> None:
    eng = engine(pattern, attention, page, kind="hiradix")
    assert isinstance(eng.cache, HybridHiRadixCache)
    cfg = eng.model.cfg
    first = serve(eng, random_prompt(cfg, FIRST, 21), ANSWER)
    to_host(eng)
    history = first.origin_input_ids + first.output_ids
    second = serve(eng, history + random_prompt(cfg, 3, 22), 5)  # few: the state shows
    cached = FIRST + ANSWER - 1
    assert (second.device_hit, second.host_hit) == (0, cached - cached % page)
    assert_equals_cold(eng, second)
    if "L" in pattern:
        assert eng.cache.stats().host_components.states_loaded == 1
    assert_pools_whole(eng)


def test_host_copy_keeps_swa_kv_the_device_tombstoned() -> None:
    """A small SWA pool tombstones the first turn's window on the device, but its backup (taken
    at insert, before) still holds it: once the full KV is evicted to the host, the second turn
    is a whole host hit, equal to cold."""
    eng = engine("FSL", swa_tokens=128, max_requests=2, kind="hiradix")
    cfg = eng.model.cfg
    first = serve(eng, random_prompt(cfg, FIRST, 3), ANSWER)
    for seed in (4, 5, 6):
        serve(eng, random_prompt(cfg, 45, seed), 5)
    assert eng.cache.stats().components.swa_tombstoned_total >= FIRST + ANSWER - 1
    to_host(eng)
    history = first.origin_input_ids + first.output_ids
    second = serve(eng, history + [1, 2, 3], 4)
    assert second.host_hit == FIRST + ANSWER - 1
    assert_equals_cold(eng, second)
    assert_pools_whole(eng)
