"""Which request calls the engine makes into its cache: a request that ends in the step that
ends its prompt goes to ``cache_finished_req`` alone (as SGLang's scheduler does), one that
goes on decoding or whose prompt is chunked gets ``cache_unfinished_req`` after each chunk."""

from __future__ import annotations

from typing import Any

import pytest

from hicache.engine import CacheSpec, EngineConfig, Status, build_engine
from hicache.model import ModelConfig, TinyTransformer
from hicache.radix import HiCacheConfig
from tests.engine.helpers import assert_matches_reference, assert_no_leak

RECORD = dict(max_running_requests=2, record_logits=True)


def counting_engine(kind: str, max_prefill_tokens: int) -> tuple[Any, list[str]]:
    """An engine whose cache logs each ``cache_*_req`` call (its name) in ``calls``."""
    spec = CacheSpec(
        kind=kind,
        device_tokens=256,
        page_size=4,
        max_context_len=128,
        max_requests=4,
        hicache=HiCacheConfig(hicache_ratio=4.0, load_back_threshold=1),
    )
    config = EngineConfig(max_prefill_tokens=max_prefill_tokens, **RECORD)
    engine = build_engine(TinyTransformer(ModelConfig(num_layers=2)), spec, config)
    calls: list[str] = []
    for name in ("cache_unfinished_req", "cache_finished_req"):
        call = getattr(engine.cache, name)
        setattr(
            engine.cache, name, lambda req, n=name, c=call, **kw: calls.append(n) or c(req, **kw)
        )
    return engine, calls


@pytest.mark.parametrize("kind", ["radix", "hiradix"])
def test_a_request_ending_with_its_prefill_is_cached_once_as_finished(kind: str) -> None:
    engine, calls = counting_engine(kind, max_prefill_tokens=64)
    prompt = list(range(1, 23))
    first = engine.submit(prompt, 1)
    engine.run()
    assert calls == ["cache_finished_req"] and first.status is Status.FINISHED
    again = engine.submit(prompt, 1)
    engine.run()
    assert again.device_hit == 20  # the first request's whole pages were inserted
    assert_matches_reference(engine, [first, again], atol=1e-5)
    assert_no_leak(engine)


@pytest.mark.parametrize(
    ("max_new", "chunk", "expected"),
    [
        (2, 64, ["cache_unfinished_req", "cache_finished_req"]),  # decodes after its prefill
        (1, 8, ["cache_unfinished_req"] * 2 + ["cache_finished_req"]),  # 22 tokens, 3 chunks
    ],
)
def test_unfinished_requests_are_still_cached_after_each_chunk(
    max_new: int, chunk: int, expected: list[str]
) -> None:
    engine, calls = counting_engine("hiradix", max_prefill_tokens=chunk)
    req = engine.submit(list(range(1, 23)), max_new)
    engine.run()
    assert calls == expected and req.status is Status.FINISHED
    assert_matches_reference(engine, [req], atol=1e-5)
    assert_no_leak(engine)
