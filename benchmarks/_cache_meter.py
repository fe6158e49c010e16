"""Wall time an engine spends inside its cache: the cache's calls, its pools' and its TP group's.

``CacheMeter(engine)`` wraps, on the instances only, the calls a scheduler makes into the cache
(the radix / hierarchical cache API: events, match, locks, load-back, insert on finish, eviction,
storage hooks, ``note_prefill``), into its token allocator and request table (allocation, free,
table writes) and into its TP group (every agreement). ``seconds`` sums the outermost calls: a
wrapped call made from inside another is counted once; ``agree_seconds`` is the part spent in TP
agreements (waiting for the other ranks included). What stays outside: the scheduler's own
loop, building the model's batch (``ForwardBatch.build``), the forward and sampling.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

CACHE_CALLS = (
    "check_hicache_events match_prefix inc_lock_ref dec_lock_ref evictable_size evict "
    "init_load_back ready_to_load_host_cache consume_load_batch drain_transfers "
    "cache_unfinished_req cache_finished_req note_prefill stats prefetch_from_storage "
    "check_prefetch_progress pop_prefetch_loaded_tokens release_aborted_request has_storage_tier"
).split()
POOL_CALLS = "alloc free available_size write".split()
TP_CALLS = ("agree",)


def metered_calls(engine: Any) -> list[tuple[Any, str, str]]:
    """``(owner, name, label)`` of every call a :class:`CacheMeter` meters on ``engine``, label
    ``cache.<name>``, ``alloc.<name>``, ``req.<name>`` or ``tp.<name>``."""
    parts = (
        (engine.cache, "cache", CACHE_CALLS),
        (engine.allocator, "alloc", POOL_CALLS),
        (engine.req_to_token_pool, "req", POOL_CALLS),
        (engine.tp, "tp", TP_CALLS),
    )
    return [
        (part, name, f"{label}.{name}")
        for part, label, names in parts
        for name in names
        if hasattr(part, name)
    ]


class CacheMeter:
    """Seconds spent inside ``engine``'s cache, pools and TP group so far (``seconds``), and
    inside its TP agreements (``agree_seconds``, part of ``seconds``)."""

    def __init__(self, engine: Any) -> None:
        self.seconds = self.agree_seconds = 0.0
        self._depth = 0
        for part, name, _ in metered_calls(engine):
            setattr(part, name, self._timed(getattr(part, name), name in TP_CALLS))

    def _timed(self, call: Callable[..., Any], agreement: bool) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._depth += 1
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self._depth -= 1
                took = time.perf_counter() - start
                if agreement:
                    self.agree_seconds += took
                if self._depth == 0:
                    self.seconds += took

        return timed
