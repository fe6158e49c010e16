"""Checkpoints at branch points (the engine's default ``CheckpointPolicy(at_branch=True)``):
a request whose match reports ``mamba_branching_seqlen`` ends a prompt chunk there, the cache
checkpoints the recurrent state at that node, and the next request sharing only that prefix
resumes from it with the logits of a cold prefill."""

from __future__ import annotations

import pytest

from hicache.engine import CacheSpec, build_engine
from hicache.engine.hybrid import TOKENS_PER_STATE, default_state_slots
from hicache.model import TinyTransformer
from hicache.radix import CheckpointPolicy
from tests.engine.test_engine_hybrid import assert_equals_cold, assert_pools_whole, engine, serve
from tests.model.hybrid_harness import hybrid_config, random_prompt

CASES = [(p, a, ps) for p in ("FSL", "FSLFSL") for a in ("mha", "mla") for ps in (1, 16)]
IDS = [f"{p}-{a}-page{ps}" for p, a, ps in CASES]
SYSTEM = 32  # the shared system prompt: two pages of 16


@pytest.mark.parametrize(("pattern", "attention", "page"), CASES, ids=IDS)
def test_second_user_checkpoints_the_shared_prefix(pattern: str, attention: str, page: int) -> None:
    eng = engine(pattern, attention, page)
    system = random_prompt(eng.model.cfg, SYSTEM, 1)
    serve(eng, system + random_prompt(eng.model.cfg, 20, 2), 3)
    second = serve(eng, system + random_prompt(eng.model.cfg, 20, 3), 3)
    assert second.device_hit == 0 and second.mamba_branching_seqlen == SYSTEM
    assert_equals_cold(eng, second)
    third = serve(eng, system + random_prompt(eng.model.cfg, 20, 4), 3)
    assert third.device_hit == SYSTEM and third.mamba_branching_seqlen is None
    assert_equals_cold(eng, third)
    assert_pools_whole(eng)


def test_without_at_branch_the_shared_prefix_never_hits() -> None:
    eng = engine("FSL", checkpoint=CheckpointPolicy())
    system = random_prompt(eng.model.cfg, SYSTEM, 1)
    for seed in (2, 3, 4):
        req = serve(eng, system + random_prompt(eng.model.cfg, 20, seed), 3)
        assert req.device_hit == 0 and req.mamba_branching_seqlen is None


def test_default_state_slots() -> None:
    """``max_requests`` rows plus one checkpoint per ``TOKENS_PER_STATE`` device tokens, at
    least ``max_requests``; the engine's state pool has that many slots."""
    assert default_state_slots(CacheSpec(device_tokens=64 * TOKENS_PER_STATE)) == 64 + 64
    assert default_state_slots(CacheSpec(device_tokens=1024, max_requests=4)) == 4 + 16
    assert default_state_slots(CacheSpec(device_tokens=64, max_requests=4)) == 4 + 4
    model = TinyTransformer(hybrid_config("FSL", "mha"))
    eng = build_engine(model, CacheSpec(device_tokens=1024, max_context_len=256, max_requests=4))
    assert eng.req_to_token_pool.mamba_pool.size == 20
    assert CacheSpec().checkpoint == CheckpointPolicy(at_finish=True, at_branch=True)
