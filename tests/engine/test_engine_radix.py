"""The engine over a device-only RadixCache reproduces cache-free logits exactly (fp32, CPU)."""

from __future__ import annotations

import pytest

from hicache.engine import CacheSpec, EngineConfig, Status, build_engine
from hicache.model import ModelConfig, TinyTransformer
from tests.engine.helpers import assert_matches_reference, assert_no_leak, chat

MHA = ModelConfig(attention="mha", num_layers=2)
MLA = ModelConfig(attention="mla", num_layers=2, num_kv_heads=1)
RECORD = EngineConfig(max_running_requests=4, max_prefill_tokens=32, record_logits=True)


def engine_for(cfg: ModelConfig, device_tokens: int, page_size: int = 1, **kw: object):
    spec = CacheSpec(
        kind="radix",
        device_tokens=device_tokens,
        page_size=page_size,
        max_context_len=512,
        max_requests=8,
    )
    return build_engine(TinyTransformer(cfg), spec, EngineConfig(**{**RECORD.__dict__, **kw}))


@pytest.mark.parametrize("cfg", [MHA, MLA], ids=["mha", "mla"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_roomy_cache_hits_and_matches_reference(cfg: ModelConfig, page_size: int) -> None:
    engine = engine_for(cfg, 2048, page_size)
    reqs = chat(engine, users=3, rounds=3)
    later = reqs[3:]
    assert sum(r.device_hit for r in later) > 0.5 * sum(len(r.origin_input_ids) for r in later)
    assert_matches_reference(engine, reqs, atol=1e-5)
    assert_no_leak(engine)


@pytest.mark.parametrize("page_size", [1, 4])
def test_memory_pressure_evicts_and_still_matches(page_size: int) -> None:
    engine = engine_for(MHA, 160, page_size)
    reqs = chat(engine, users=4, rounds=3, seed=1)
    assert engine.budget.evicted_tokens > 0
    assert_matches_reference(engine, reqs, atol=1e-5)
    assert_no_leak(engine)


@pytest.mark.parametrize("page_size", [1, 4])
def test_chunked_prefill_of_long_prompts(page_size: int) -> None:
    engine = engine_for(MHA, 1024, page_size, max_prefill_tokens=7)
    reqs = chat(engine, users=2, rounds=2, system_len=40)
    assert_matches_reference(engine, reqs, atol=1e-5)
    assert_no_leak(engine)


def test_too_long_request_is_rejected_and_others_served() -> None:
    engine = engine_for(MHA, 64)
    ok = engine.submit(list(range(10)), 4)
    too_long = engine.submit(list(range(60)), 10)
    finished = engine.run()
    assert too_long.status is Status.REJECTED and "64" in (too_long.error or "")
    assert ok.status is Status.FINISHED and {ok, too_long} == set(finished)
    assert_no_leak(engine)


def test_request_of_max_context_len_fits_its_last_page() -> None:
    spec = CacheSpec(device_tokens=64, page_size=4, max_context_len=30, max_requests=2)
    engine = build_engine(TinyTransformer(MHA), spec, RECORD)
    req = engine.submit(list(range(28)), 2)  # 30 tokens; KV for 29 needs 8 whole pages
    engine.run()
    assert req.status is Status.FINISHED, req.error
    assert_matches_reference(engine, [req], atol=1e-5)
    assert_no_leak(engine)


@pytest.mark.parametrize("bad", [([], 3), ([1, 999], 3), ([1, 2], 0), ([1, -2], 1)])
def test_submit_rejects_bad_input(bad: tuple[list[int], int]) -> None:
    engine = engine_for(MHA, 64)
    with pytest.raises(ValueError):
        engine.submit(*bad)
    assert not engine.has_work()
