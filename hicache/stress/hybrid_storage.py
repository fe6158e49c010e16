"""The storage tier of a hybrid stress run (``StressConfig.hicache.storage``): the store, its
faults, and turns that wait on a prefetch, driven as the engine's scheduler drives them.

With a storage tier, a turn whose prompt the tree misses past its hit may (half the time) wait
on a prefetch before it runs: ``prefetch_from_storage`` reads the rest's pages (every attention
layer's KV) and the recurrent state at the last page that has one into host slots. The
``prefetch_progress`` op polls the waiting turns, aborts a few (``release_aborted_request``),
and queues those whose prefetch ended: they are admitted first, through the usual match and
load-back, so a prefix storage served is checked like any other before it is used
(``hybrid_checks.check_served``: every token's full KV, the window's SWA KV, the restored
state); the host copies a prefetch adopted are swept after every op (``sweep_hybrid``).
``StressConfig.p_storage_error`` makes the KV store and the state store raise or report reads
missing (``Faults.flaky_storage``); a reset keeps the store (a warm restart: the next
prefetches read what the cache wrote before).

Storage runs on the cache's threads (backups, reads), so a run with a storage tier does not
replay exactly: which backups landed before a prefetch asks (and, under the ``timeout``
policy, how much of a read lands in time) depends on timing.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from hicache.backends import StorageConfig
from hicache.radix import RadixKey
from hicache.stress.faults import Faults
from hicache.stress.workload import Turn, Workload

STORES = ("memory", "file")


def storage_tier(
    backend: str = "memory", root: str = "", policy: str = "wait_complete", max_bytes: int = 1 << 18
) -> StorageConfig:
    """A stress storage tier (``HiCacheConfig.storage``).

    Parameters
    ----------
    backend : ``memory`` (a store per cache) or ``file`` (under ``root``, shared by every
        cache over it).
    root : the file store's directory (``file`` only).
    policy : the prefetch policy (``StorageConfig.prefetch_policy``): ``wait_complete``, or
        ``timeout`` (2 ms: partial reads, pages cut before the last state).
    max_bytes : the store's cap: past it the oldest objects go, so pages and states go missing.

    Prefetches start at one page, always read (no load-or-recompute model) and move eight
    pages per batch.
    """
    if backend not in STORES:
        raise ValueError(f"backend must be one of {STORES}, got {backend!r}")
    if (backend == "file") != bool(root):
        raise ValueError(f"root must be given for a file store only, got {root!r} for {backend}")
    extra: dict[str, Any] = {"max_bytes": max_bytes} | ({"root": root} if root else {})
    return StorageConfig(
        backend=backend,
        extra_config=extra,
        model_id="stress/hybrid",
        prefetch_policy=policy,
        prefetch_threshold=1,
        prefetch_timeout_base=0.002,
        prefetch_timeout_per_ki_token=0.0,
        query_batch_pages=8,
        io_batch_pages=8,
        cost_aware=False,
    )


def install_storage_faults(faults: Faults, cache: Any) -> None:
    """``faults.flaky_storage`` over ``cache``'s KV store and its state store (if any)."""
    tier = cache.storage_tier
    if tier is None:
        return
    faults.flaky_storage(tier.storage.backend)
    if tier.states is not None and tier.states.storage.backend is not tier.storage.backend:
        faults.flaky_storage(tier.states.storage.backend)


class Prefetches:
    """Turns waiting on a storage prefetch, and turns whose prefetch ended (see the module
    docstring). ``counts``: the driver's (``prefetch_started``, ``prefetch_aborted``,
    ``prefetch_loaded_tokens``)."""

    def __init__(
        self, cache: Any, workload: Workload, rng: random.Random, counts: Counter[str]
    ) -> None:
        self.cache, self.workload, self.rng, self.counts = cache, workload, rng, counts
        self.waiting: dict[str, Turn] = {}
        self.ready: list[tuple[Turn, int]] = []
        self.started = 0

    def next_turn(self) -> tuple[Turn | None, int | None]:
        """The turn to admit next: one whose prefetch ended, with the tokens it adopted, else
        a new turn (None: not prefetched; the turn is None when every conversation is busy)."""
        if self.ready:
            return self.ready.pop(0)
        return self.workload.next_turn(), None

    def park(self, turn: Turn, match: Any) -> bool:
        """Half the time, make ``turn`` wait on a prefetch of what ``match`` (of its prompt)
        misses; True when it waits (a storage tier took the prefetch)."""
        if self.cache.storage_tier is None or self.rng.random() < 0.5:
            return False
        hit = match.device_prefix_len + match.host_hit_length
        rid = f"prefetch-{self.started}"
        self.started += 1
        rest = RadixKey(turn.prompt[hit:], turn.conversation.tenant)
        if not self.cache.prefetch_from_storage(rid, match.last_host_node, rest):
            return False
        self.waiting[rid] = turn
        self.counts["prefetch_started"] += 1
        return True

    def progress(self) -> None:
        """Poll every waiting turn: a few are aborted (the turn ends), those whose prefetch
        ended are queued to be admitted next."""
        for rid, turn in list(self.waiting.items()):
            if self.rng.random() < 0.15:
                del self.waiting[rid]
                self.cache.release_aborted_request(rid)
                self.workload.finish(turn, completed=False)
                self.counts["prefetch_aborted"] += 1
            elif self.cache.check_prefetch_progress(rid):
                del self.waiting[rid]
                loaded = self.cache.pop_prefetch_loaded_tokens(rid)
                self.counts["prefetch_loaded_tokens"] += loaded
                self.ready.append((turn, loaded))

    def abort_all(self) -> None:
        """Abort every prefetch; every waiting or queued turn ends unserved."""
        for rid, turn in self.waiting.items():
            self.cache.release_aborted_request(rid)
            self.workload.finish(turn, completed=False)
        for turn, _ in self.ready:
            self.workload.finish(turn, completed=False)
        self.waiting.clear()
        self.ready.clear()
