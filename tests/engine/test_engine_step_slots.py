"""A step's KV slots: one allocation for all its requests, each token's slot read back right."""

from __future__ import annotations

from typing import Any

import pytest

from hicache.engine import CacheSpec, EngineConfig, Status, build_engine
from hicache.engine.request import Request
from hicache.model import ModelConfig, TinyTransformer

PAGE = 4


def decoding_engine(requests: int) -> Any:
    """An engine with ``requests`` requests of a 4-token prompt, all decoding."""
    spec = CacheSpec(
        kind="radix", device_tokens=256, page_size=PAGE, max_context_len=64, max_requests=8
    )
    model = TinyTransformer(ModelConfig(num_layers=1))
    engine = build_engine(model, spec, EngineConfig(max_running_requests=requests + 1))
    for i in range(requests):
        engine.submit([1 + i, 2, 3, 4 + i], 12)
    engine.step()  # every prompt in one step
    assert all(r.status is Status.DECODE for r in engine.scheduler.active)
    return engine


def test_a_decode_step_allocates_every_requests_page_at_once() -> None:
    engine = decoding_engine(3)
    calls: list[int] = []
    alloc = engine.allocator.alloc
    engine.allocator.alloc = lambda n: calls.append(n) or alloc(n)
    for _ in range(PAGE):  # the requests cross a page boundary in the same step
        engine.step()
    assert calls == [3 * PAGE]


def test_each_decode_token_gets_the_slot_its_row_names() -> None:
    engine = decoding_engine(3)
    for _ in range(PAGE + 1):
        plan = engine.scheduler.plan()
        table = engine.req_to_token_pool.req_to_token
        want = [int(table[w.req.req_pool_idx, w.req.kv_len]) for w in plan.work]
        assert plan.slots.tolist() == want and len(set(want)) == len(want)
        for w in plan.work:  # the step's forward and sampling, without the model
            w.req.kv_len += 1
            w.req.output_ids.append(0)


def test_next_input_ids_is_the_rest_of_the_prompt_then_the_last_token() -> None:
    req = Request(0, [5, 6, 7], max_new_tokens=4)
    req.kv_len = 1
    assert req.next_input_ids == [6, 7]
    req.output_ids.append(8)
    req.kv_len = 3
    assert req.next_input_ids == [8]
    req.kv_len = 2  # part of the prompt and the token after it
    assert req.next_input_ids == [7, 8]


@pytest.mark.parametrize("new", [1, 3])
def test_mixed_steps_match_a_request_alone(new: int) -> None:
    """A decode request and a prompt chunk in one step: their slots are disjoint, in order."""
    engine = decoding_engine(1)
    engine.submit([9] * (PAGE + new), 2)
    plan = engine.scheduler.plan()
    assert [len(w.input_ids) for w in plan.work] == [1, PAGE + new]
    table = engine.req_to_token_pool.req_to_token
    want = [
        int(table[w.req.req_pool_idx, w.req.kv_len + i])
        for w in plan.work
        for i in range(len(w.input_ids))
    ]
    assert plan.slots.tolist() == want and len(set(want)) == len(want)
