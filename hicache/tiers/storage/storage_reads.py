"""PrefetchReads: the reads of a storage tier's prefetches, decided alike on every TP rank:
what to do with each answered existence query (read the hit into reserved host slots, or end
the prefetch), and when the slots a cancelled read leaves are released.

The ranks agree on the hit (the shortest over ranks) and on whether loading beats recomputing
(every rank's cost model says so), then make host room for every read at once (so one rank's
failed reservation cannot change what another evicts) and read only where every rank got its
slots. A hit shorter than ``threshold`` tokens is not read (``revoked``); nor is one the cost
model says is slower to load than to recompute (``slower``). A cancelled read's slots that
were not adopted are released once every rank's thread has let go of them and no timed-out
read still running in the backend holds them (``held``: they are quarantined until it returns).
``PrefetchRequest`` and ``PrefetchFollower`` are the storage tier's prefetches in flight.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from hicache.backends import StorageConfig
from hicache.backends.cost import LoadCost
from hicache.backends.deadline import touches
from hicache.backends.io import Prefetch, PrefetchState, StorageIO
from hicache.radix.key import edge_ids
from hicache.radix.node import TreeNode
from hicache.radix.tree import RadixTree
from hicache.tiers.host.host_tier import HostTier
from hicache.tiers.storage.storage_backup import StorageBackups


@dataclass
class PrefetchRequest:
    """A prefetch in flight: the operation and the tokens it would insert."""

    op: Prefetch
    ids: np.ndarray  # the request's tokens from the root through its last prefetched page
    extra_key: object
    start: int  # tokens of ``ids`` above the prefetched pages (the anchor's depth)
    hashes: list[bytes]  # one per prefetched page
    lead_key: str  # the first page's key (the storage tier's leader of that key)
    decided: bool = False  # whether ``decide`` has answered its query


@dataclass
class PrefetchFollower:
    """A request whose first pages another request (``leader``) is already reading: it waits
    for that read, then prefetches what is still missing below it."""

    leader: str
    ids: np.ndarray  # the request's tokens from the root through its last whole page
    extra_key: object
    started: float


class PrefetchReads:
    """Starts and retires the reads of a storage tier's prefetches (see the module docstring).

    Attributes
    ----------
    revoked, slower : prefetches ended as too short / as slower than recomputing (counters).
    """

    def __init__(
        self,
        host: HostTier,
        io: StorageIO,
        config: StorageConfig,
        cost: LoadCost,
        threshold: int,
        page_size: int,
        held: Callable[[], torch.Tensor],
    ) -> None:
        self.host, self.io, self.config, self.cost = host, io, config, cost
        self.held = held  # host slots of timed-out backend calls still running
        self.threshold, self.page_size = threshold, page_size
        self.revoked = self.slower = 0
        self._retiring: list[Prefetch] = []  # cancelled ops whose unadopted slots await release

    def decide(self, ops: list[Prefetch]) -> list[bool]:
        """Read or end each of ``ops`` (undecided prefetches, the same on every rank) whose
        query every rank has answered; which ones were decided."""
        ps, n = self.page_size, len(ops)
        hits = [-1 if op.state is PrefetchState.QUERYING else op.hit_pages for op in ops]
        worth = [int(self._worth(max(h, 1))) for h in hits]
        agreed, _ = self.host.tp.agree(hits + worth, where="storage prefetch hits")
        reading = []
        for op, pages, good in zip(ops, agreed[:n], agreed[n:], strict=True):
            if pages < 0:
                continue  # some rank's query is still running
            if pages * ps < self.threshold:
                self.revoked += 1
            elif not good:
                self.slower += 1
            else:
                reading.append((op, pages))
                continue
            op.cancel()  # QUERIED -> DONE: nothing to read
        if reading:
            self._reserve_and_read(reading)
        return [pages >= 0 for pages in agreed[:n]]

    def _worth(self, pages: int) -> bool:
        cost_aware = self.config.cost_aware
        return not cost_aware or self.cost.worth_loading(pages, pages * self.page_size)

    def _reserve_and_read(self, reading: list[tuple[Prefetch, int]]) -> None:
        ps, host = self.page_size, self.host
        host.make_room(sum(pages for _, pages in reading) * ps)
        slots = [host.reserve(pages * ps) for _, pages in reading]
        got, _ = host.tp.agree([int(s is not None) for s in slots], where="storage prefetch slots")
        for (op, pages), mine, ok in zip(reading, slots, got, strict=True):
            if ok and mine is not None:
                self.io.read(op, mine, pages)
                continue
            if mine is not None:
                host.release(mine)
            op.cancel()

    def retire(self, op: Prefetch) -> None:
        """Release ``op``'s remaining reserved slots once its thread is done with them."""
        self._retiring.append(op)
        self.release_retired()

    def retiring(self) -> int:
        """Retired reads whose thread is not done with them (quarantined ones not counted:
        they wait for the backend, not for the thread)."""
        return sum(op.progress()[0] is not PrefetchState.DONE for op in self._retiring)

    def release_retired(self, held: torch.Tensor | None = None) -> None:
        """Release the slots of the retired reads every rank is done with, but those in
        ``held`` (default: ``self.held()``)."""
        if not self._retiring:
            return
        held = self.held() if held is None else held
        done = [int(self._free(op, held)) for op in self._retiring]
        done, _ = self.host.tp.agree(done, where="storage prefetch release")
        keep = []
        for op, ok in zip(self._retiring, done, strict=True):
            if not ok:
                keep.append(op)
            elif op.host_indices is not None:
                self.host.release(op.host_indices)
                op.host_indices = None
        self._retiring = keep

    def give_up(self) -> None:
        """Release the slots of every retired read whose thread is done, quarantined ones too
        (``clear``/``close``: the cache stops waiting for a hung backend)."""
        self.release_retired(torch.empty(0, dtype=torch.int64))

    @staticmethod
    def _free(op: Prefetch, held: torch.Tensor) -> bool:
        """Whether ``op``'s slots may be released: its thread is done and no timed-out call
        still holds one of them."""
        return op.progress()[0] is PrefetchState.DONE and not touches(op.host_indices, held)


def adopt_pages(
    tree: RadixTree,
    host: HostTier,
    backups: StorageBackups,
    request: PrefetchRequest,
    pages: int,
    clock: itertools.count[int],
) -> TreeNode | None:
    """Insert the first ``pages`` prefetched pages of ``request`` as a host-only leaf (the
    new leaf, or None when nothing was inserted). The slots of pages the tree already holds
    (or cannot take) stay in ``request.op`` for ``PrefetchReads.retire``."""
    ps, op = backups.page_size, request.op
    if not pages:
        return None
    assert op.host_indices is not None
    ids = request.ids[: request.start + pages * ps]
    path, missing = tree.walk(ids, request.extra_key)
    pos = sum(len(node.key) for node in path)
    parent = path[-1] if path else tree.root
    if missing is None or pos < request.start or (path and not host.hangs_below(parent)):
        return None  # all present, the prefix above was evicted, or no host-only child there
    first = (pos - request.start) // ps  # prefetched pages before ``pos`` are duplicates
    leaf = TreeNode(edge_ids(ids[pos:]), None, parent, request.extra_key, next(clock))
    leaf.host_value = op.host_indices[first * ps : pages * ps]
    leaf.hash_value = request.hashes[first:pages]
    backups.remember(leaf.hash_value)
    host.adopt(leaf, missing)
    # The adopted slots now belong to the leaf: retire only the others.
    op.host_indices = torch.cat([op.host_indices[: first * ps], op.host_indices[pages * ps :]])
    return leaf
