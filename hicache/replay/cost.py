"""The replay's clock: modelled compute time plus transfer time at a measured bandwidth.

No model runs in a replay, so compute is modelled: ``prefill_tps`` prompt tokens per second
and one ``decode_step_s`` per decode iteration (memory-bound decode: the step time does not
depend on the batch). Loads from the host run layer by layer under the compute, so an
iteration takes ``max(compute, load bytes / h2d bandwidth + storage bytes / storage
bandwidth)``: a page from storage is read to the host first, then loaded like a host hit.
The h2d bandwidth is the flag when given, else measured once on the replay's own pools
(``measure_bandwidth``: real backups and load-backs through a small cache of the same
geometry and backend; for a hybrid model, of its attention layers). A host hit of a model with
linear layers loads its recurrent state too: ``ReplayConfig.state_bytes`` more at the h2d
bandwidth (``Replayer.step``). The storage bandwidth is
the flag (``ReplayConfig.storage_gbps``: a documented figure, not measured, as the replay's
store is not the deployment's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hicache.radix import RadixKey
from hicache.replay.config import PROBE_TIERS, ReplayConfig
from hicache.stack import KVStack

_PROBE_TOKENS = 4096  # per measured round trip
_PROBE_ROUNDS = 3  # after one warm-up round


@dataclass(frozen=True)
class CostModel:
    """Seconds per iteration. ``h2d_bytes_per_s`` / ``d2h_bytes_per_s`` are 0 without a host
    tier (nothing moves); ``measured`` says whether they were measured or given as flags.
    ``storage_bytes_per_s``: storage reads (0: no storage tier)."""

    prefill_tps: float
    decode_step_s: float
    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    measured: bool
    storage_bytes_per_s: float = 0.0

    def step_seconds(
        self, prefill_tokens: int, decoding: bool, load_bytes: int, storage_bytes: int = 0
    ) -> float:
        compute = prefill_tokens / self.prefill_tps + (self.decode_step_s if decoding else 0.0)
        load = load_bytes / self.h2d_bytes_per_s if load_bytes else 0.0
        if storage_bytes:
            load += storage_bytes / self.storage_bytes_per_s
        return max(compute, load)


def measure_bandwidth(cfg: ReplayConfig) -> tuple[float, float]:
    """``(h2d, d2h)`` bytes/s of the real transfer ops on pools of ``cfg``'s geometry, device,
    backend and layout: ``_PROBE_TOKENS`` tokens backed up, evicted and loaded back, a few
    times, through a fresh cache's public calls; bytes and busy time from ``cache.stats()``
    (the rounds after the warm-up)."""
    n = _PROBE_TOKENS - _PROBE_TOKENS % cfg.page_size or cfg.page_size
    probe = cfg.full_attention().with_(host_ratio=max(cfg.host_ratio, 2.0), **PROBE_TIERS)
    stack = probe.build_stack(n + 1, size=n)
    _round_trip(stack, n, 0)  # warm-up: kernel compiles, first touches
    before = stack.cache.stats().transfer
    for r in range(1, _PROBE_ROUNDS + 1):
        _round_trip(stack, n, r)
    after = stack.cache.stats().transfer
    assert before is not None and after is not None, "the probe has a host tier"
    h2d_s, d2h_s = after.h2d_seconds - before.h2d_seconds, after.d2h_seconds - before.d2h_seconds
    assert h2d_s > 0 and d2h_s > 0, "the probe moved KV both ways"
    return (after.h2d_bytes - before.h2d_bytes) / h2d_s, (
        after.d2h_bytes - before.d2h_bytes
    ) / d2h_s


def _round_trip(stack: KVStack, n: int, salt: int) -> None:
    """Insert ``n`` tokens (write-through: backed up), evict them, match and load them back,
    then evict both tiers so the next round starts empty."""
    cache, key = stack.cache, RadixKey(np.full(n, salt, dtype=np.int32))
    cache.insert(key, stack.allocator.alloc(n))
    cache.drain_transfers()
    cache.evict(n)
    m = cache.match_prefix(key)
    loaded, _ = cache.init_load_back(m.last_host_node, m.host_hit_length)
    cache.consume_load_batch(cache.ready_to_load_host_cache())
    cache.drain_transfers()
    assert len(loaded) == n, "the probe's load-back was queued"
    cache.evict(n)
    cache.evict_host(n)
