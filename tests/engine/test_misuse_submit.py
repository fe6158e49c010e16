"""Misuse: ``Engine.submit`` (and ``Engine`` / ``build_engine``) driven with arguments of the wrong
type or range. Each is refused with a TypeError/ValueError naming the argument, before anything
changes; nothing is converted (no ``"123"`` -> ``[1, 2, 3]``, no truncated floats), and the engine
keeps serving."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from hicache.engine import CacheSpec, Engine, EngineConfig, Status, build_cache, build_engine
from hicache.model import ModelConfig, TinyTransformer, make_kv_pool
from hicache.pools import ReqToTokenPool, TokenToKVPoolAllocator

CFG = ModelConfig(num_layers=1, vocab_size=64)
SPEC = CacheSpec(device_tokens=64, max_context_len=64, max_requests=4)
CONFIG = EngineConfig(max_running_requests=2, max_prefill_tokens=32)
GOOD = {"prompt": [1, 2, 3, 4], "max_new_tokens": 2, "extra_key": None, "arrival": None}

BAD: list[tuple[str, Any, type[Exception]]] = [
    ("prompt", "123", TypeError),
    ("prompt", b"\x01\x02", TypeError),
    ("prompt", [1.0, 2.0], TypeError),
    ("prompt", [1, 2.5], TypeError),
    ("prompt", [1, True, 3], TypeError),
    ("prompt", [[1, 2]], TypeError),
    ("prompt", np.array([1.0, 2.0]), TypeError),
    ("prompt", torch.tensor([1.5]), TypeError),
    ("prompt", np.zeros((0, 2), np.int64), ValueError),
    ("prompt", None, TypeError),
    ("prompt", 7, TypeError),
    ("prompt", {1, 2}, TypeError),
    ("prompt", [], ValueError),
    ("prompt", [1, 64], ValueError),
    ("prompt", [-1, 2], ValueError),
    ("max_new_tokens", 2.0, TypeError),
    ("max_new_tokens", True, TypeError),
    ("max_new_tokens", "3", TypeError),
    ("max_new_tokens", None, TypeError),
    ("max_new_tokens", 0, ValueError),
    ("extra_key", [1], TypeError),
    ("extra_key", {"lora": 1}, TypeError),
    ("extra_key", True, TypeError),
    ("extra_key", 1.0, TypeError),
    ("extra_key", float("nan"), TypeError),
    ("extra_key", ("lora", [1]), TypeError),
    ("arrival", "now", TypeError),
    ("arrival", True, TypeError),
    ("arrival", float("nan"), ValueError),
    ("arrival", float("inf"), ValueError),
]


@pytest.fixture
def engine() -> Engine:
    return build_engine(TinyTransformer(CFG), SPEC, CONFIG)


def state(engine: Engine) -> tuple:
    engine.cache.check_invariants()
    return (
        engine.has_work(),
        engine.allocator.available_size(),
        engine.cache.total_size(),
        engine.req_to_token_pool.available_size(),
        engine.forward_passes,
    )


def serve(engine: Engine, **kw: Any) -> Any:
    req = engine.submit(**{**GOOD, **kw})
    engine.run()
    assert req.status is Status.FINISHED, req.error
    return req


@pytest.mark.parametrize("name, value, error", BAD, ids=lambda v: repr(v)[:24])
def test_bad_submit_argument_is_refused_before_any_change(engine, name, value, error) -> None:
    serve(engine)
    before = state(engine)
    with pytest.raises(error, match=name):
        engine.submit(**{**GOOD, name: value})
    assert state(engine) == before
    assert engine.step() == []
    assert serve(engine).device_hit == 3


def test_unhashable_extra_key_does_not_wedge_step(engine) -> None:
    with pytest.raises(TypeError, match="extra_key"):
        engine.submit([1, 2, 3], 2, extra_key=["lora"])
    assert not engine.has_work()
    req = serve(engine, prompt=[5, 6, 7])
    assert len(req.output_ids) == 2


def test_integer_arrays_are_prompts_of_python_ints(engine) -> None:
    for prompt in (np.array([3, 4, 5], np.int16), torch.tensor([3, 4, 5]), (3, 4, 5)):
        req = serve(engine, prompt=prompt)
        assert req.origin_input_ids == [3, 4, 5]
        assert all(type(t) is int for t in req.origin_input_ids)


def test_namespaces_that_python_equates_stay_apart_in_the_engine(engine) -> None:
    prompt = list(range(10, 30))
    assert serve(engine, prompt=prompt, extra_key=1).device_hit == 0
    assert serve(engine, prompt=prompt, extra_key="1").device_hit == 0
    assert serve(engine, prompt=prompt, extra_key=(1,)).device_hit == 0
    assert serve(engine, prompt=prompt, extra_key=(1,)).device_hit == len(prompt) - 1


def _parts(cfg: ModelConfig = CFG) -> tuple[ReqToTokenPool, TokenToKVPoolAllocator]:
    kv = make_kv_pool(cfg, 64, 1, "cpu")
    return ReqToTokenPool(4, 64, "cpu"), TokenToKVPoolAllocator(64, 1, "cpu", kv)


def test_engine_parts_must_fit_together() -> None:
    model = TinyTransformer(CFG)
    pool, allocator = _parts()
    cache = build_cache(SPEC, pool, allocator)
    with pytest.raises(TypeError, match="config"):
        Engine(model, cache, pool, allocator, {"max_running_requests": 2})
    with pytest.raises(TypeError, match="model"):
        Engine(object(), cache, pool, allocator)
    other_pool, other_allocator = _parts()
    with pytest.raises(ValueError, match="req_to_token_pool"):
        Engine(model, cache, other_pool, allocator)
    with pytest.raises(ValueError, match="allocator"):
        Engine(model, cache, pool, other_allocator)
    for cfg in (
        ModelConfig(num_layers=2, vocab_size=64),
        ModelConfig(head_dim=8, vocab_size=64),
        ModelConfig(attention="mla", num_layers=1, num_kv_heads=1, vocab_size=64),
    ):
        pool2, allocator2 = _parts(cfg)
        with pytest.raises((TypeError, ValueError), match="get_kvcache"):
            Engine(model, build_cache(SPEC, pool2, allocator2), pool2, allocator2)
    with pytest.raises(TypeError, match="spec"):
        build_engine(model, {"kind": "radix"})
    with pytest.raises(TypeError, match="model"):
        build_engine(None, SPEC)
    engine = Engine(model, cache, pool, allocator, CONFIG)
    assert len(serve(engine).output_ids) == 2
