"""The engine serves hybrid models (full, sliding-window and linear layers) through a
``HybridRadixCache``: a request served from a device hit gives the logits of the same request
computed cold, also when SWA KV was tombstoned or recurrent states evicted under pressure, and
every pool is whole again after a reset."""

from __future__ import annotations

import pytest
import torch

from hicache.backends import StorageConfig
from hicache.engine import CacheSpec, Engine, EngineConfig, Request, Status, build_engine
from hicache.model import TinyTransformer
from hicache.radix import CheckpointPolicy, HiCacheConfig, HybridRadixCache, RadixCache
from tests.model.hybrid_harness import hybrid_config, random_prompt

CASES = [(p, a, ps) for p in ("FSL", "FSLFSL") for a in ("mha", "mla") for ps in (1, 16)]
IDS = [f"{p}-{a}-page{ps}" for p, a, ps in CASES]
TOL = {"atol": 1e-5, "rtol": 0}
FIRST, ANSWER = 40, 9  # the first turn ends at 40 + 9 - 1 = 48 tokens of KV: 3 pages of 16


def engine(pattern: str, attention: str = "mha", page: int = 1, **spec: object) -> Engine:
    model = TinyTransformer(hybrid_config(pattern, attention))
    sizes: dict[str, object] = {"device_tokens": 512, "max_context_len": 256, "max_requests": 4}
    cache = CacheSpec(page_size=page, **{**sizes, **spec})  # type: ignore[arg-type]
    return build_engine(model, cache, EngineConfig(record_logits=True))


def serve(eng: Engine, prompt: list[int], new: int) -> Request:
    req = eng.submit(prompt, new)
    eng.run()
    assert req.status is Status.FINISHED, req.error
    return req


def assert_equals_cold(eng: Engine, req: Request) -> None:
    """``req``'s logits equal those of the same request on a fresh engine (a cold prefill)."""
    cold = engine(eng.model.cfg.layer_pattern, eng.model.cfg.attention, eng.budget.page_size)
    ref = serve(cold, req.origin_input_ids, req.max_new_tokens)
    assert ref.device_hit == 0 and ref.output_ids == req.output_ids
    torch.testing.assert_close(torch.stack(req.logits), torch.stack(ref.logits), **TOL)


def assert_pools_whole(eng: Engine) -> None:
    """After a reset every pool's free count is its size: full and SWA KV, rows, states."""
    eng.cache.check_invariants()
    eng.cache.reset()
    alloc = eng.allocator
    for full, free in (("size_full", "full_available_size"), ("size_swa", "swa_available_size")):
        if hasattr(alloc, full):
            assert getattr(alloc, free)() == getattr(alloc, full)
    assert alloc.available_size() == alloc.size
    rows = eng.req_to_token_pool
    assert rows.available_size() == rows.size
    states = getattr(rows, "mamba_pool", None)
    if states is not None:
        assert states.available_size() == states.size


def second_turn(eng: Engine, seed: int) -> tuple[Request, Request]:
    """A first turn, then a second that extends it (its prompt and answer, then more)."""
    cfg = eng.model.cfg
    first = serve(eng, random_prompt(cfg, FIRST, seed), ANSWER)
    history = first.origin_input_ids + first.output_ids
    return first, serve(eng, history + random_prompt(cfg, 20, seed + 1), 5)


@pytest.mark.parametrize(("pattern", "attention", "page"), CASES, ids=IDS)
def test_multi_turn_device_hit_equals_cold(pattern: str, attention: str, page: int) -> None:
    eng = engine(pattern, attention, page)
    assert isinstance(eng.cache, HybridRadixCache)
    _, second = second_turn(eng, seed=1)
    assert second.device_hit == FIRST + ANSWER - 1  # resumed from the first turn's state
    assert_equals_cold(eng, second)
    # page 1: each turn's end; page 16: the first turn's end (48) and both prompts' last page
    # boundaries (32, 64: their prompts, 40 and 69 tokens, end mid-page)
    assert eng.cache.stats().components.states_held == (2 if page == 1 else 3)
    assert_pools_whole(eng)


@pytest.mark.parametrize("pattern", ["FSL", "FS"])
def test_swa_pool_pressure_tombstones_then_recomputes(pattern: str) -> None:
    """A small SWA pool: other requests' tokens tombstone the first turn's window, so the
    second turn recomputes (the match ends before its broken window: here at 0), equal to
    cold; the tombstoned nodes get live SWA KV back from it (revived)."""
    eng = engine(pattern, swa_tokens=128, max_requests=2)
    cfg = eng.model.cfg
    first = serve(eng, random_prompt(cfg, FIRST, 3), ANSWER)
    for seed in (4, 5, 6):  # 3 x 50 new tokens: the SWA pool (128) runs short twice
        serve(eng, random_prompt(cfg, 45, seed), 5)
    history = first.origin_input_ids + first.output_ids
    match = eng.cache.match_prefix(history[:-1])  # the full KV is all there, not the window
    assert match.full_kv_hit_length == FIRST + ANSWER - 1 and match.device_prefix_len == 0
    assert eng.cache.stats().components.swa_tombstoned_tokens >= FIRST + ANSWER - 1
    second = serve(eng, history + [1, 2, 3], 4)
    assert second.device_hit == 0
    cached = (second.origin_input_ids + second.output_ids)[:-1]  # revived: usable whole
    assert eng.cache.match_prefix(cached).device_prefix_len == len(cached)
    assert_equals_cold(eng, second)
    assert_pools_whole(eng)


def test_state_pool_pressure_evicts_states_then_recomputes() -> None:
    """The fewest state slots (2 per row): later requests' checkpoints evict the first turn's
    state by LRU; its node stays for full KV, and the second turn recomputes, equal to cold."""
    eng = engine("FSL", max_requests=2, state_slots=4)
    cfg = eng.model.cfg
    first = serve(eng, random_prompt(cfg, FIRST, 6), ANSWER)
    for seed in range(7, 11):
        serve(eng, random_prompt(cfg, 30, seed), 3)
    assert eng.cache.stats().components.states_evicted > 0
    history = first.origin_input_ids + first.output_ids
    match = eng.cache.match_prefix(history[:-1])
    assert match.state_slot is None and match.full_kv_hit_length == FIRST + ANSWER - 1
    second = serve(eng, history + [7, 8], 4)
    assert second.device_hit == 0
    assert_equals_cold(eng, second)
    assert_pools_whole(eng)


def to_host(eng: Engine) -> None:
    """Land every backup, then evict the whole device tier (backed-up nodes stay, host-only)."""
    eng.cache.drain_transfers()
    eng.cache.evict(eng.cache.evictable_size())


@pytest.mark.parametrize("kind", ["radix", "hiradix"])
def test_every_tokens_checkpoints_chunked_prefill(kind: str) -> None:
    """``CheckpointPolicy(every_tokens=16)``, the scheduler ending prefill chunks at multiples
    of 16 (the chunk limit is larger): a request sharing only the
    first 32 tokens of a long prompt resumes there, equal to cold; with the host tier, from
    the host (the checkpoints were backed up with their nodes, then the device evicted)."""
    model = TinyTransformer(hybrid_config("FSL", "mha"))
    spec = CacheSpec(
        kind=kind,
        device_tokens=512,
        max_context_len=256,
        max_requests=4,
        checkpoint=CheckpointPolicy(every_tokens=16),
    )
    eng = build_engine(model, spec, EngineConfig(record_logits=True))  # chunks cut at 16s
    doc = random_prompt(model.cfg, 60, 12)
    serve(eng, doc, 2)
    if kind == "hiradix":
        to_host(eng)
    other = serve(eng, doc[:32] + random_prompt(model.cfg, 10, 13), 3)
    assert other.device_hit + other.host_hit == 32 and other.host_hit == (
        32 if kind == "hiradix" else 0
    )
    assert_equals_cold(eng, other)
    assert_pools_whole(eng)


def test_hybrid_misuse() -> None:
    model = TinyTransformer(hybrid_config("FSL", "mha"))
    memory = HiCacheConfig(storage=StorageConfig(backend="memory", tiering="exclusive"))
    with pytest.raises(ValueError, match="storage tier is inclusive only"):
        build_engine(model, CacheSpec(kind="hiradix", hicache=memory))
    with pytest.raises(ValueError, match="state_slots"):
        CacheSpec(max_requests=4, state_slots=7)
    with pytest.raises(ValueError, match="swa_tokens"):
        CacheSpec(page_size=16, device_tokens=512, swa_tokens=40)
    with pytest.raises(ValueError, match="every_tokens"):
        CacheSpec(page_size=16, device_tokens=512, checkpoint=CheckpointPolicy(every_tokens=8))
    with pytest.raises(TypeError, match="checkpoint must be a CheckpointPolicy"):
        CacheSpec(checkpoint="at_finish")  # type: ignore[arg-type]
    plain = build_engine(TinyTransformer(hybrid_config("F", "mha")), CacheSpec())
    assert type(plain.cache) is RadixCache
    with pytest.raises(TypeError, match="cache must be a HybridRadixCache"):
        Engine(model, plain.cache, plain.req_to_token_pool, plain.allocator)


# (prompt, answer, tracked): 41 + 4 ends at 44 before the next page boundary, so the state
# at 32 is the prompt's last page boundary (the scheduler ended its prefill there); 20 + 20
# ends at 39, and the state at 32 is the one the engine tracked in decode (SGLang's extra
# buffer), not the prompt's boundary (16).
MID_PAGE = [(41, 4, None), (20, 20, 32)]


@pytest.mark.parametrize("kind", ["radix", "hiradix"])
@pytest.mark.parametrize("attention", ["mha", "mla"])
@pytest.mark.parametrize(("prompt", "answer", "tracked"), MID_PAGE)
def test_a_turn_ending_mid_page_resumes_from_its_last_page_boundary(
    kind: str, attention: str, prompt: int, answer: int, tracked: int | None
) -> None:
    """Page 16, a first turn ending mid-page: the tree keeps 32 tokens and a state there, so
    the next turn resumes at 32 (from the host after the device is evicted), equal to cold.
    The track slots come back with every row."""
    eng = engine("FSL", attention, 16, kind=kind)
    assert eng.req_to_token_pool.enable_mamba_extra_buffer
    first = serve(eng, random_prompt(eng.model.cfg, prompt, 31), answer)
    assert first.mamba_last_track_seqlen == tracked
    if kind == "hiradix":
        to_host(eng)
    second = serve(eng, first.origin_input_ids + first.output_ids + [5, 6, 7], 3)
    assert second.device_hit + second.host_hit == 32
    assert_equals_cold(eng, second)
    assert_pools_whole(eng)


def test_decode_tracking_is_off_where_it_cannot_help() -> None:
    """Page 1 (every end is a page boundary) and a policy without ``at_finish``: no track
    slots, no tracking."""
    for eng in (
        engine("FSL", "mha", 1),
        engine("FSL", "mha", 16, checkpoint=CheckpointPolicy(at_finish=False, at_branch=True)),
    ):
        assert not eng.req_to_token_pool.enable_mamba_extra_buffer
        assert serve(eng, list(range(3, 23)), 20).mamba_last_track_seqlen is None
