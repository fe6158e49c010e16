"""StorageTier: the storage tier (L3) of a HiRadixCache, below its ``HostTier``.

Storage holds pages by key (``hicache.storage.keys``: the node's chained page hash, so a key
names a whole prefix in one namespace), not tree nodes: a prefix that only storage has is not
in the tree. Two flows connect them, both through host slots:

- **Prefetch** (``prefetch`` / ``progress``): on a miss of at least ``prefetch_threshold``
  tokens below a node the host holds (or the root), the page keys of the rest are asked of
  storage on the prefetch thread. Only when the answer is long enough, and loading it is
  expected to beat recomputing (``LoadCost``), are host slots reserved and the pages read. When
  the prefetch policy lets the request go, the pages read so far (a whole-page prefix) become
  host-only leaves under the deepest node of their path (the existing load-back takes over),
  duplicates of nodes that appeared meanwhile are released, and the rest is cancelled; slots
  still being written are released once the thread lets go of them.
- **Backup** (``backed_up``, called by the host tier on each host write ack): every node on the
  path whose pages are not yet queued is written to storage, parents first, on one thread, so
  no prefix has holes. A node being written is **pinned**: the host tier will not evict it
  until storage has acknowledged, so the bytes read are the node's.

A failed or refused storage call is a miss; nothing here raises on a backend failure.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from hicache.radix.device_only import check_req_id
from hicache.radix.host_tier import HostTier
from hicache.radix.key import RadixKey, edge_ids
from hicache.radix.node import TreeNode
from hicache.radix.page_hash import namespace_seed, node_hashes, page_hashes
from hicache.radix.slots import as_tensor
from hicache.radix.stats import StorageTierStats
from hicache.radix.tree import RadixTree
from hicache.storage import StorageConfig, StorageKeys
from hicache.storage.cost import LoadCost
from hicache.storage.guard import GuardedStorage
from hicache.storage.io import Backup, Prefetch, PrefetchState, StorageIO

# Page hashes known to be queued for or present in storage; oldest forgotten first (a
# forgotten page is at worst written again: ``batch_set_v1`` skips what is present).
_KNOWN_PAGES_MAX = 1 << 20


@dataclass
class _Request:
    """A prefetch in flight: the operation and the tokens it would insert."""

    op: Prefetch
    ids: np.ndarray  # the request's tokens from the root through its last prefetched page
    extra_key: object
    start: int  # tokens of ``ids`` above the prefetched pages (the anchor's depth)
    hashes: list[bytes]  # one per prefetched page


class StorageTier:
    """See the module docstring. Built by ``HiRadixCache`` (``storage_build.build_storage``).

    Parameters
    ----------
    tree, host : the cache's tree and host tier.
    io : the I/O threads over the guarded backend ``storage``.
    keys : the page keys of this rank and model.
    config : the storage settings.
    cost : the load-or-recompute model (fed by ``io``'s reads and ``note_prefill``).
    clock : the cache's access clock (ticks for new nodes).
    """

    def __init__(
        self,
        tree: RadixTree,
        host: HostTier,
        io: StorageIO,
        storage: GuardedStorage,
        keys: StorageKeys,
        config: StorageConfig,
        cost: LoadCost,
        clock: itertools.count[int],
    ) -> None:
        self.tree, self.host, self.io, self.storage = tree, host, io, storage
        self.keys, self.config, self.cost, self._clock = keys, config, cost, clock
        self.page_size = tree.page_size
        ps = self.page_size
        self.threshold = -(-config.prefetch_threshold // ps) * ps  # whole pages
        self._requests: dict[str, _Request] = {}
        self._retiring: list[tuple[Prefetch, int]] = []  # cancelled ops, pages adopted
        self._loaded: dict[str, int] = {}
        self._pinned: dict[int, TreeNode] = {}  # nodes with a backup in flight, by id
        self._pins: Counter[int] = Counter()  # node id -> its backups in flight
        self._known: OrderedDict[bytes, None] = OrderedDict()
        self._prefetches = self._revoked = self._slower = self._loaded_tokens = 0
        self._backup_pages = 0

    # ---- prefetch ----------------------------------------------------------------------------

    def prefetch(self, req_id: str, anchor: TreeNode, tokens: object) -> bool:
        """Contract in ``BasePrefixCache.prefetch_from_storage``."""
        check_req_id(req_id)
        path = self.tree.path_to_root(anchor)
        key = tokens if isinstance(tokens, RadixKey) else RadixKey(tokens)
        if req_id in self._requests:
            raise ValueError(f"prefetch_from_storage: request {req_id!r} is already prefetching")
        if path and anchor.extra_key != key.extra_key:
            raise ValueError("new_input_tokens: its extra_key differs from last_host_node's")
        ps, ids = self.page_size, key.token_ids
        n = len(ids) - len(ids) % ps
        if n < self.threshold or (path and anchor.host_slots is None):
            return False  # short, or the anchor is not on the host: no host-only child
        prior = node_hashes(anchor, ps)[-1] if path else namespace_seed(key.extra_key)
        hashes = page_hashes(ids[:n], ps, prior)
        above = [node.key for node in reversed(path)]
        full = np.concatenate([*above, ids[:n]]) if above else ids[:n]
        op = Prefetch(req_id, self.keys.page_keys(hashes))
        self._requests[req_id] = _Request(op, full, key.extra_key, len(full) - n, hashes)
        self._prefetches += 1
        self.io.query(op)
        return True

    def progress(self, req_id: str) -> bool:
        """Contract in ``BasePrefixCache.check_prefetch_progress``."""
        check_req_id(req_id)
        self.poll()
        request = self._requests.get(req_id)
        if request is None:
            return True
        state, _ = request.op.progress()
        policy = self.config.prefetch_policy
        if state is not PrefetchState.DONE and policy != "best_effort":
            if policy == "wait_complete":
                return False
            waited = time.monotonic() - request.op.started
            if waited < self.config.prefetch_timeout(len(request.hashes) * self.page_size):
                return False
        self._finish(req_id, request)
        return True

    def pop_loaded(self, req_id: str) -> int:
        check_req_id(req_id)
        return self._loaded.pop(req_id, 0)

    def abort(self, req_id: str) -> None:
        check_req_id(req_id)
        request = self._requests.pop(req_id, None)
        if request is not None:
            self._retire(request.op, 0)

    def _finish(self, req_id: str, request: _Request) -> None:
        del self._requests[req_id]
        _, pages = request.op.cancel()
        adopted = self._adopt(request, pages) if pages else 0
        self._loaded[req_id] = adopted
        self._loaded_tokens += adopted
        self._retire(request.op, pages)

    def _adopt(self, request: _Request, pages: int) -> int:
        """Insert the first ``pages`` prefetched pages as a host-only leaf; returns its tokens.
        The slots of pages the tree already holds (or cannot take) stay for ``_retire``."""
        ps, op = self.page_size, request.op
        assert op.host_indices is not None
        ids = request.ids[: request.start + pages * ps]
        path, missing = self.tree.walk(ids, request.extra_key)
        pos = sum(len(node.key) for node in path)
        parent = path[-1] if path else self.tree.root
        if missing is None or pos < request.start or (path and parent.host_slots is None):
            return 0  # all present, the prefix above was evicted, or the parent is not on host
        first = (pos - request.start) // ps  # prefetched pages before ``pos`` are duplicates
        leaf = TreeNode(edge_ids(ids[pos:]), None, parent, request.extra_key, next(self._clock))
        leaf.host_value = op.host_indices[first * ps : pages * ps]
        leaf.hash_value = request.hashes[first:pages]
        self._remember(leaf.hash_value)
        self.host.adopt(leaf, missing)
        # The adopted slots now belong to the leaf: retire only the others.
        op.host_indices = torch.cat([op.host_indices[: first * ps], op.host_indices[pages * ps :]])
        return len(leaf.key)

    def _retire(self, op: Prefetch, adopted_pages: int) -> None:
        """Release ``op``'s remaining reserved slots once its thread is done with them."""
        self._retiring.append((op, adopted_pages))
        self._release_retired()

    def _release_retired(self) -> None:
        keep = []
        for op, adopted in self._retiring:
            state, _ = op.progress()
            if state is not PrefetchState.DONE:
                keep.append((op, adopted))
            elif op.host_indices is not None:
                self.host.release(op.host_indices)
                op.host_indices = None
        self._retiring = keep

    def _start_reads(self) -> None:
        """Decide each answered query: read (slots reserved now), or end it."""
        for request in self._requests.values():
            op = request.op
            if op.state is not PrefetchState.QUERIED:
                continue
            pages = op.hit_pages
            tokens = pages * self.page_size
            slots = None
            if tokens < self.threshold:
                self._revoked += 1
            elif self.config.cost_aware and not self.cost.worth_loading(pages, tokens):
                self._slower += 1
            else:
                slots = self.host.reserve(tokens)
            if slots is None:
                op.cancel()  # QUERIED -> DONE: nothing to read
            else:
                self.io.read(op, slots, pages)

    # ---- backup ------------------------------------------------------------------------------

    def pins(self, node: TreeNode) -> bool:
        return node.id in self._pinned

    def backed_up(self, node: TreeNode) -> None:
        """Queue storage writes for the nodes from the root to ``node`` not yet queued."""
        if not self.keys.writes:
            return
        for n in reversed(self.tree.path_to_root(node)):
            if n.host_slots is None:
                return  # prefix order: nothing below a node storage cannot get from the host
            hashes = node_hashes(n, self.page_size)
            if hashes[-1] in self._known:
                continue
            self._remember(hashes)
            self._pinned[n.id] = n
            self._pins[n.id] += 1
            self.host.refile(n)
            self.io.backup(Backup(n, self.keys.page_keys(hashes), as_tensor(n.host_slots)))

    def _remember(self, hashes: list[bytes]) -> None:
        known = self._known
        for h in hashes:
            known[h] = None
        while len(known) > _KNOWN_PAGES_MAX:
            known.popitem(last=False)

    def _finish_backups(self) -> None:
        for op in self.io.finished_backups():
            self._backup_pages += op.written_pages
            node = op.tag
            assert isinstance(node, TreeNode)
            self._pins[node.id] -= 1
            if not self._pins[node.id]:
                del self._pins[node.id], self._pinned[node.id]
                self.host.refile(node)
            if op.written_pages < len(op.keys):  # not stored: let a later backup try again
                for h in node.hash_value or []:
                    self._known.pop(h, None)

    # ---- polling, draining, stats ------------------------------------------------------------

    def poll(self) -> None:
        """Process finished backups, start the reads answered queries allow, release retired
        slots (never blocks)."""
        self._finish_backups()
        self._start_reads()
        self._release_retired()

    def settle(self) -> None:
        """Block until every queued storage operation has finished; process them. (A poll
        may start reads, hence the loop: at most two rounds.)"""
        while True:
            self.io.drain()
            self.poll()
            if not self._busy():
                return

    def _busy(self) -> bool:
        running = (PrefetchState.QUERYING, PrefetchState.READING)
        return bool(self._pinned or self._retiring) or any(
            r.op.progress()[0] in running for r in self._requests.values()
        )

    def clear(self) -> None:
        """Cancel every prefetch, wait for the threads, release every reserved slot."""
        for req_id in list(self._requests):
            self.abort(req_id)
        self.settle()
        self._loaded.clear()
        self._known.clear()

    def close(self) -> None:
        self.clear()
        self.io.close()

    def stats(self) -> StorageTierStats:
        s = self.storage.stats()
        return StorageTierStats(
            backend=s.backend,
            queries=s.queries,
            query_pages=s.query_pages,
            hit_pages=s.hit_pages,
            prefetches=self._prefetches,
            prefetch_revoked=self._revoked,
            prefetch_skipped_slower=self._slower,
            prefetch_loaded_tokens=self._loaded_tokens,
            backup_pages=self._backup_pages,
            pending_prefetches=len(self._requests),
            pending_backups=self._pins.total(),
            bytes_read=s.bytes_read,
            bytes_written=s.bytes_written,
            read_seconds=s.read_seconds,
            write_seconds=s.write_seconds,
            failures=s.failures + s.refused,
            breaker_state=s.breaker_state,
        )
