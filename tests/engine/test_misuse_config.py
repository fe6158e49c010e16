"""Misuse: engine, cache-spec and bench settings of the wrong type or not finite (bools for
ints, floats for counts, NaN, infinities, strings). Each frozen config refuses them in
``__post_init__`` with a TypeError/ValueError naming the field; nothing is converted."""

from __future__ import annotations

import math
import re
from dataclasses import fields
from typing import Any

import pytest

from hicache.bench import BenchConfig
from hicache.engine import CacheSpec, EngineConfig
from hicache.radix import HiCacheConfig
from tests.engine.helpers import TINY

NAN, INF = float("nan"), float("inf")
HOST_FIELDS = {f.name for f in fields(HiCacheConfig)}

ENGINE = [
    ("max_running_requests", 2.0, TypeError),
    ("max_running_requests", True, TypeError),
    ("max_running_requests", 0, ValueError),
    ("max_prefill_tokens", "8", TypeError),
    ("record_logits", "no", TypeError),
    ("record_logits", 1, TypeError),
    ("stall_timeout_s", NAN, ValueError),
    ("stall_timeout_s", 0, ValueError),
    ("stall_timeout_s", -INF, ValueError),
    ("stall_timeout_s", True, TypeError),
    ("stall_timeout_s", "30", TypeError),
]
SPEC = [
    ("device_tokens", True, TypeError),
    ("device_tokens", 64.0, TypeError),
    ("page_size", 0, ValueError),
    ("max_requests", None, TypeError),
    ("hicache_ratio", INF, ValueError),
    ("hicache_ratio", NAN, ValueError),
    ("hicache_ratio", "2", TypeError),
    ("hicache_ratio", 0.5, ValueError),
    ("hicache_size_gb", INF, ValueError),
    ("hicache_size_gb", NAN, ValueError),
    ("load_back_threshold", 2.5, TypeError),
]
BENCH = [
    ("users", 2.5, TypeError),
    ("users", True, TypeError),
    ("rounds", 0, ValueError),
    ("system_len", NAN, TypeError),
    ("system_len", -1, ValueError),
    ("seed", 1.5, TypeError),
    ("seed", -1, ValueError),
    ("threads", 1.5, TypeError),
    ("threads", 0, ValueError),
    ("arrival_rate", NAN, ValueError),
    ("arrival_rate", INF, ValueError),
    ("arrival_rate", True, TypeError),
    ("arrival_rate", "1", TypeError),
    ("host_ratio", NAN, ValueError),
    ("host_ratio", INF, ValueError),
    ("host_ratio", True, TypeError),
    ("host_ratio", 0, ValueError),
    ("dtype", ["float32"], ValueError),
]


def _ids(value: Any) -> str:
    return repr(value)[:20]


@pytest.mark.parametrize("name, value, error", ENGINE, ids=_ids)
def test_engine_config_names_the_bad_field(name: str, value: Any, error: type) -> None:
    with pytest.raises(error, match=name):
        EngineConfig(**{name: value})


def test_engine_config_takes_an_infinite_stall_timeout() -> None:
    assert EngineConfig(stall_timeout_s=math.inf).stall_timeout_s == math.inf


@pytest.mark.parametrize("name, value, error", SPEC, ids=_ids)
def test_cache_spec_names_the_bad_field(name: str, value: Any, error: type) -> None:
    """Host-tier fields are refused by the ``HiCacheConfig`` a spec nests, or by the spec
    itself (``hicache_ratio`` below 1)."""
    with pytest.raises(error, match=name):
        if name in HOST_FIELDS:
            CacheSpec(hicache=HiCacheConfig(**{name: value}))
        else:
            CacheSpec(**{name: value})


def test_cache_spec_refuses_a_hicache_that_is_not_a_config() -> None:
    with pytest.raises(TypeError, match="hicache"):
        CacheSpec(kind="hiradix", hicache={"hicache_ratio": 4.0})  # type: ignore[arg-type]


@pytest.mark.parametrize("name, value, error", BENCH, ids=_ids)
def test_bench_config_names_the_bad_flag(name: str, value: Any, error: type) -> None:
    with pytest.raises(error, match=re.escape("--" + name.replace("_", "-"))):
        BenchConfig.from_args({**TINY, name: value})
    assert BenchConfig.from_args(TINY).users == TINY["users"]
