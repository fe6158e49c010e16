"""A budget on the Python calls of the finish path (``cache_finished_req`` of a prefill step
whose prefix was a host hit: its insert, its backup's queueing, issue and settle), outside the
KV copies themselves. On the scheduler's path each call costs ~1 us (issue 35: under 100 us
of the cache's own CPU per step), so a change that adds calls to this path must say why."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from hicache.engine import CacheSpec, EngineConfig, Status, build_engine
from hicache.model import ModelConfig, TinyTransformer
from hicache.radix import HiCacheConfig

BUDGET = 75  # calls per finish here: 124 at cd2b7d2, 70 after the finish path's cuts
# the spans that plan and copy KV (the control-plane figure subtracts their time)
COPIES = {"batch_backend", "transfer_indices", "backup_from_device_all_layer"}
PREFIX, PAGE = 256, 16


def counted(call: Callable[..., Any], calls: list[int]) -> Callable[..., Any]:
    """``call``, appending to ``calls`` the Python calls each of its runs made outside
    ``COPIES``."""

    def run(*args: Any, **kwargs: Any) -> Any:
        count, copying = 0, 0

        def profile(frame: FrameType, event: str, arg: object) -> None:
            nonlocal count, copying
            name = frame.f_code.co_name
            if event == "call":
                copying += name in COPIES
                count += not copying
            elif event == "return" and name in COPIES:
                copying -= 1

        sys.setprofile(profile)
        try:
            return call(*args, **kwargs)
        finally:
            sys.setprofile(None)
            calls.append(count)

    return run


def test_a_host_hit_prefill_finishes_within_the_call_budget() -> None:
    spec = CacheSpec(
        kind="hiradix",
        device_tokens=8 * PREFIX,
        page_size=PAGE,
        max_context_len=4 * PREFIX,
        max_requests=4,
        hicache=HiCacheConfig(hicache_ratio=4.0, load_back_threshold=1),
    )
    model = TinyTransformer(ModelConfig(num_heads=4, num_kv_heads=4, num_layers=2))
    engine = build_engine(model, spec, EngineConfig(max_prefill_tokens=4 * PREFIX))
    prefix = [(7 * i) % 200 for i in range(PREFIX)]
    engine.submit(prefix, 1)
    engine.run()
    calls: list[int] = []
    engine.cache.cache_finished_req = counted(engine.cache.cache_finished_req, calls)
    for i in range(3):
        engine.cache.drain_transfers()
        engine.cache.check_hicache_events()
        engine.cache.evict(engine.allocator.size)  # the prefix: on the host only
        req = engine.submit(prefix + [201 + i] * PAGE, 1)
        engine.step()
        assert req.status is Status.FINISHED and req.host_hit >= PREFIX - PAGE
    engine.cache.check_invariants()
    assert len(calls) == 3 and max(calls) <= BUDGET, calls
