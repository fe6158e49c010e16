"""The engine's side of the storage tier, against scripted hooks (``StorageSpy``): the calls a
scheduler makes and in which order, admission passing over a prefetching request, storage
hits per request, aborts, the stall check, and tenant salts."""

from __future__ import annotations

import random

import pytest

from hicache.engine import CacheSpec, EngineConfig, Status, build_engine
from hicache.engine.request import SALT_TAG, request_namespace
from hicache.model import ModelConfig, TinyTransformer
from hicache.radix import HiCacheConfig, RadixKey
from tests.engine.helpers import assert_matches_reference, assert_no_leak, chat
from tests.engine.storage_spy import StorageSpy

MHA = ModelConfig(attention="mha", num_layers=2)
RECORD = EngineConfig(max_running_requests=4, max_prefill_tokens=64, record_logits=True)


def engine_for(kind: str = "hiradix", config: EngineConfig = RECORD, device_tokens: int = 512):
    spec = CacheSpec(
        kind=kind,
        device_tokens=device_tokens,
        max_context_len=256,
        max_requests=8,
        hicache=HiCacheConfig(hicache_ratio=4.0, load_back_threshold=4),
    )
    return build_engine(TinyTransformer(MHA), spec, config)


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(MHA.vocab_size) for _ in range(length)] for _ in range(n)]


@pytest.mark.parametrize("kind", ["radix", "hiradix"])
def test_without_storage_nothing_is_asked_and_nothing_changes(kind: str) -> None:
    engine = engine_for(kind, device_tokens=160)
    asked: list[object] = []
    engine.cache.prefetch_from_storage = lambda *args: asked.append(args)
    reqs = chat(engine, users=3, rounds=3, seed=5)
    assert not asked and all(r.storage_hit == 0 for r in reqs)
    assert engine.cache.stats().prefix.match_calls == len(reqs)  # one lookup per admission
    assert sum(r.device_hit + r.host_hit for r in reqs) > 0
    assert_matches_reference(engine, reqs, atol=1e-5)
    assert_no_leak(engine)


def test_admission_passes_over_a_prefetching_request_in_fifo_order() -> None:
    engine = engine_for(config=EngineConfig(max_running_requests=1, max_prefill_tokens=64))
    spy = StorageSpy(engine.cache, start={"0"})
    a, b, c = (engine.submit(p, 2) for p in prompts(3, 20, seed=1))
    finished = []
    while b.status is not Status.FINISHED or c.status is not Status.FINISHED:
        finished += engine.step()
    assert finished == [b, c] and a.status is Status.WAITING  # b before c: FIFO kept
    assert spy.hooks("prefetch_from_storage") == ["0", "1", "2"]  # all asked on arrival
    spy.done.add("0")
    finished += engine.run()
    assert finished == [b, c, a] and a.status is Status.FINISHED
    order = [hook for hook, rid in spy.calls if rid == "0"]
    assert order[0] == "prefetch_from_storage" and order[-1] == "pop_prefetch_loaded_tokens"
    assert set(order[1:-1]) == {"check_prefetch_progress"}
    assert_no_leak(engine)


def test_prefetch_gets_the_tokens_after_the_hit_in_the_request_namespace() -> None:
    engine = engine_for()
    spy = StorageSpy(engine.cache)
    shared, tail = prompts(2, 24, seed=2)
    engine.submit(shared, 1, extra_key="lora")
    engine.run()
    req = engine.submit(shared + tail, 1, extra_key="lora", cache_salt="t1")
    other = engine.submit(shared + tail, 1, extra_key="lora")
    engine.run()
    node, key = spy.prefetch_args[str(req.rid)]
    assert isinstance(key, RadixKey) and key.extra_key == (SALT_TAG, "t1", "lora")
    assert key.token_ids.tolist() == (shared + tail)[:-1]  # another salt: nothing hit
    _, key = spy.prefetch_args[str(other.rid)]
    assert key.extra_key == "lora" and key.token_ids.tolist() == tail[:-1]
    assert other.device_hit == len(shared) and req.device_hit == 0


def test_storage_tokens_are_counted_apart_from_host_hits() -> None:
    engine = engine_for()
    spy = StorageSpy(engine.cache)
    prompt = prompts(1, 40, seed=3)[0]
    engine.submit(prompt, 1)
    engine.run()
    engine.cache.drain_transfers()
    engine.cache.check_hicache_events()
    assert engine.cache.evict(1000) > 0  # the prompt is now host-only
    spy.start.add("1")
    req = engine.submit(prompt, 3)
    engine.step()
    assert req.status is Status.WAITING
    spy.done.add("1")
    spy.loaded["1"] = 16
    engine.run()
    assert (req.device_hit, req.storage_hit, req.host_hit) == (0, 16, len(prompt) - 1 - 16)
    assert req.computed == 1


def test_note_prefill_reports_each_prefill_forward() -> None:
    engine = engine_for(config=EngineConfig(max_running_requests=2, max_prefill_tokens=16))
    spy = StorageSpy(engine.cache)
    reqs = [engine.submit(p, 4) for p in prompts(2, 30, seed=4)]
    engine.run()
    noted = spy.hooks("note_prefill")
    assert sum(tokens for tokens, _ in noted) == sum(r.computed for r in reqs) == 60
    assert all(0 < tokens <= 16 and seconds > 0 for tokens, seconds in noted)
    assert len(noted) < engine.forward_passes  # decode-only passes are not reported


def test_abort_while_prefetching_releases_it() -> None:
    engine = engine_for()
    spy = StorageSpy(engine.cache, start={"0"})
    a, b = (engine.submit(p, 2) for p in prompts(2, 20, seed=6))
    engine.step()
    assert engine.abort(a) and not engine.abort(a) and not engine.abort(b)  # b is admitted
    assert spy.hooks("release_aborted_request") == ["0"]
    done = engine.run()
    assert done[0] is a and a.status is Status.ABORTED and b.status is Status.FINISHED
    with pytest.raises(TypeError, match="req"):
        engine.abort("0")  # type: ignore[arg-type]
    assert_no_leak(engine)


def test_a_prefetch_that_reads_is_not_a_stall_and_one_that_never_ends_is() -> None:
    engine = engine_for(config=EngineConfig(stall_timeout_s=0.05))
    spy = StorageSpy(engine.cache, start={"0", "1"})
    spy.reading = True
    req = engine.submit(prompts(1, 20, seed=7)[0], 1)
    for _ in range(200):  # ~0.2 s of idle steps (1 ms sleeps), bytes arriving
        engine.step()
    assert req.status is Status.WAITING
    spy.done.add("0")
    engine.run()
    assert req.status is Status.FINISHED
    spy.reading = False
    engine.submit(prompts(1, 20, seed=8)[0], 1)
    with pytest.raises(RuntimeError, match="stalled"):
        engine.run()


def test_cache_salt_separates_namespaces_and_none_keeps_extra_key() -> None:
    engine = engine_for(kind="radix")
    prompt = prompts(1, 30, seed=9)[0]
    first = engine.submit(prompt, 1, cache_salt="tenant-a")
    engine.run()
    same, other, unsalted = (
        engine.submit(prompt, 1, cache_salt=salt) for salt in ("tenant-a", "tenant-b", None)
    )
    engine.run()
    assert first.device_hit == 0 and same.device_hit == len(prompt) - 1
    assert other.device_hit == 0 and unsalted.device_hit == 0
    assert unsalted.extra_key is None and same.extra_key == (SALT_TAG, "tenant-a", None)


def test_request_namespace_is_one_to_one_and_checked() -> None:
    keys = [None, "a", 1, ("a", 1)]
    salts = [None, "", "a", "b"]
    spaces = {request_namespace(k, s) for k in keys for s in salts}
    assert len(spaces) == len(keys) * len(salts)
    assert request_namespace(("x", 2), None) == ("x", 2)
    with pytest.raises(TypeError, match="cache_salt"):
        request_namespace(None, b"a")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="extra_key"):
        request_namespace((SALT_TAG, "a", None), None)  # would pose as salted
    with pytest.raises(TypeError, match="extra_key"):
        request_namespace(1.5, "a")
    engine = engine_for(kind="radix")
    with pytest.raises(TypeError, match="cache_salt"):
        engine.submit([1, 2, 3], 1, cache_salt=7)  # type: ignore[arg-type]
    assert not engine.has_work()


def test_storage_config_needs_a_host_tier() -> None:
    from hicache.backends import StorageConfig

    with pytest.raises(ValueError, match="hiradix"):
        CacheSpec(kind="radix", hicache=HiCacheConfig(storage=StorageConfig(backend="memory")))


@pytest.mark.parametrize("kind", ["radix", "hiradix"])
def test_without_storage_the_prefill_time_is_not_reported(kind: str) -> None:
    engine = engine_for(kind)
    noted: list[object] = []
    engine.cache.note_prefill = lambda *args: noted.append(args)
    engine.submit(prompts(1, 30, seed=7)[0], 2)
    engine.run()
    assert not engine.cache.has_storage_tier() and not noted
