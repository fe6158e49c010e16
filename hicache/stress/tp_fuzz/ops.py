"""The TP fuzz's op mix: the stress runner's ops, plus storage prefetches when there is a
storage tier."""

from __future__ import annotations

from collections.abc import Callable

from hicache.radix import RadixKey
from hicache.stress.driver import Driver
from hicache.stress.runner import OPS

Op = tuple[float, Callable[[Driver], object]]


class StorageOps:
    """Prefetches from storage in flight, driven like a scheduler: start one for a prefix the
    tree misses, poll them, take the loaded tokens or abort (choices from the op stream)."""

    def __init__(self, driver: Driver) -> None:
        self.driver, self.pending, self.started = driver, list[str](), 0

    def prefetch(self, d: Driver) -> None:
        tenant, prefix = d.workload.random_prefix()
        m = d.cache.match_prefix(RadixKey(prefix, tenant))
        hit = m.device_prefix_len + m.host_hit_length
        rid = f"prefetch-{self.started}"
        self.started += 1
        rest = RadixKey(prefix[hit:], tenant)
        if d.cache.prefetch_from_storage(rid, m.last_host_node, rest):
            self.pending.append(rid)
            d.counts["prefetch_started"] += 1

    def progress(self, d: Driver) -> None:
        for rid in list(self.pending):
            if d.rng.random() < 0.2:
                self.pending.remove(rid)
                d.cache.release_aborted_request(rid)
            elif d.cache.check_prefetch_progress(rid):
                self.pending.remove(rid)
                d.counts["prefetch_loaded_tokens"] += d.cache.pop_prefetch_loaded_tokens(rid)

    def abort_all(self) -> None:
        while self.pending:
            self.driver.cache.release_aborted_request(self.pending.pop())


def op_table(storage: StorageOps, with_storage: bool) -> dict[str, Op]:
    """name -> (weight, op): the stress mix, with the prefetch ops when ``with_storage``."""
    if not with_storage:
        return dict(OPS)
    return {**OPS, "prefetch": (3, storage.prefetch), "prefetch_progress": (3, storage.progress)}
