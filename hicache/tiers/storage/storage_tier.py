"""StorageTier: the storage tier (L3) of a HiRadixCache, below its ``HostTier``.

Storage holds pages by key (``hicache.backends.keys``: the node's chained page hash, so a key
names a whole prefix in one namespace), not tree nodes: a prefix that only storage has is not
in the tree. Two flows connect them, both through host slots:

- **Prefetch** (``prefetch`` / ``progress``): on a miss of at least ``prefetch_threshold``
  tokens below a node the host holds (any node, exclusive), the page keys of the rest go to
  storage on the prefetch thread. Only when the answer is long enough, and loading it is
  expected to beat recomputing (``LoadCost``), are host slots reserved and the pages read. When
  the prefetch policy lets the request go, the pages read so far (a whole-page prefix) become
  host-only leaves under the deepest node of their path (the existing load-back takes over),
  duplicates of nodes that appeared meanwhile are released, and the rest is cancelled; slots
  still being written are released once the thread lets go of them.
- **Backup** (``StorageBackups``; when, ``StorageTiering``): ``inclusive``, on each host write
  ack (``backed_up``) every node on the path whose pages are not yet queued is written, parents
  first, on one thread, so no prefix has holes (a failed write cancels the queued writes below
  it); ``exclusive``, a host leaf is written when the host tier evicts it (``victims``). A node
  being written is **pinned**: the host tier will not evict it until storage has acknowledged.

A hybrid model's pages carry every attention layer (``backends.composite_pages``); its
recurrent states go beside them (``attach_states``, ``state_storage.StateStorage``).

A failed or refused storage call is a miss; nothing here raises on a backend failure.

Under TP every rank runs the same prefetches, and what depends on a rank's own storage answers,
threads and clock is agreed (``TPGroup.agree``): the hit length (the shortest), whether loading
beats recomputing and got host slots (on every rank, or no rank reads), when a request stops
waiting (as soon as one rank's policy lets it go) and how many pages it adopts (the fewest
read), and when a cancelled read's slots are released (once every rank's thread let go).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import numpy as np

from hicache.backends import StorageConfig, StorageKeys
from hicache.backends.cost import LoadCost
from hicache.backends.guard import GuardedStorage
from hicache.backends.io import Prefetch, PrefetchState, StorageIO
from hicache.radix.device_only import check_req_id
from hicache.radix.events import Medium, NodeEvents
from hicache.radix.key import RadixKey
from hicache.radix.node import TreeNode
from hicache.radix.page_hash import namespace_seed, node_hashes, page_hashes
from hicache.radix.policies import LeafSet
from hicache.radix.slots import Slots
from hicache.radix.stats import StorageTierStats
from hicache.radix.tree import RadixTree
from hicache.tiers.host.host_tier import HostTier
from hicache.tiers.storage.state_storage import StateStorage
from hicache.tiers.storage.storage_backup import StorageBackups
from hicache.tiers.storage.storage_reads import (
    PrefetchFollower,
    PrefetchReads,
    PrefetchRequest,
    adopt_pages,
)
from hicache.tiers.storage.storage_tiering import StorageTiering


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
    events, medium : where the KV events of the pages storage gains and loses go (None: off),
        under which ``medium`` (``StorageBackups``).
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
        events: NodeEvents | None = None,
        medium: Medium = "DISK",
    ) -> None:
        self.tree, self.host, self.io, self.storage = tree, host, io, storage
        self.keys, self.config, self.cost, self._clock = keys, config, cost, clock
        self.page_size = keys.fingerprint.page_size  # the device pool's geometry's
        ps = self.page_size
        self.threshold = -(-config.prefetch_threshold // ps) * ps  # whole pages
        self._requests: dict[str, PrefetchRequest] = {}
        self._loaded: dict[str, int] = {}
        self._leaders: dict[str, str] = {}  # first page key -> the request reading it
        self._followers: dict[str, PrefetchFollower] = {}  # requests waiting on another's read
        self.backups = StorageBackups(tree, host, io, keys, ps, events, medium, storage.held_slots)
        self.reads = PrefetchReads(host, io, config, cost, self.threshold, ps, storage.held_slots)
        self.tiering = StorageTiering(self.backups, config.tiering)
        self.tp = host.tp
        self.states: StateStorage | None = None
        self._prefetches = self._loaded_tokens = 0

    def attach_states(self, states: StateStorage) -> None:
        """Carry a hybrid model's recurrent states (``StateStorage``): written after their
        nodes' pages, and a prefetch adopts pages only up to a state it read."""
        self.states = self.backups.states = states

    # ---- prefetch ----------------------------------------------------------------------------

    def prefetch(self, req_id: str, anchor: TreeNode, tokens: object) -> bool:
        """Contract in ``BasePrefixCache.prefetch_from_storage``."""
        check_req_id(req_id)
        path = self.tree.path_to_root(anchor)
        key = tokens if isinstance(tokens, RadixKey) else RadixKey(tokens)
        if req_id in self._requests or req_id in self._followers:
            raise ValueError(f"prefetch_from_storage: request {req_id!r} is already prefetching")
        if path and anchor.extra_key != key.extra_key:
            raise ValueError("new_input_tokens: its extra_key differs from last_host_node's")
        ps, ids = self.page_size, key.token_ids
        n = len(ids) - len(ids) % ps
        if n < self.threshold or (path and not self.host.hangs_below(anchor)):
            return False  # short, or the anchor cannot have a host-only child
        prior = node_hashes(anchor, ps)[-1] if path else namespace_seed(key.extra_key)
        hashes = page_hashes(ids[:n], ps, prior)
        above = [node.key for node in reversed(path)]
        full = np.concatenate([*above, ids[:n]]) if above else ids[:n]
        keys = self.keys.page_keys(hashes)
        leader = self._leaders.get(keys[0])
        if leader is not None:  # its read covers our first page: wait for it, don't read twice
            self._followers[req_id] = PrefetchFollower(
                leader, full, key.extra_key, time.monotonic()
            )
            return True
        op = Prefetch(req_id, keys)
        self._requests[req_id] = PrefetchRequest(
            op, full, key.extra_key, len(full) - n, hashes, keys[0]
        )
        self._leaders[keys[0]] = req_id
        self._prefetches += 1
        self.io.query(op)
        return True

    def progress(self, req_id: str) -> bool:
        """Contract in ``BasePrefixCache.check_prefetch_progress``."""
        check_req_id(req_id)
        self.poll()
        follower = self._followers.get(req_id)
        if follower is not None:
            return self._follow(req_id, follower)
        request = self._requests.get(req_id)
        if request is None:
            return True
        state, pages = request.op.progress()
        tokens = len(request.hashes) * self.page_size
        mine = [int(state is PrefetchState.DONE), pages]
        go = int(not self.config.may_wait(request.op.started, tokens))
        (done, pages), (go,) = self.tp.agree(mine, [go], where="storage prefetch progress")
        if not done and not go:
            return False
        self._finish(req_id, request, pages)
        return True

    def _follow(self, req_id: str, follower: PrefetchFollower) -> bool:
        """A follower's progress: wait while its leader reads, then prefetch the rest below
        what the leader put in the tree (or go, when the policy stops waiting)."""
        if follower.leader in self._requests:
            wait = self.config.may_wait(follower.started, len(follower.ids))
            _, (go,) = self.tp.agree((), [int(not wait)], where="storage prefetch follower")
            if not go:
                return False
            del self._followers[req_id]
            return True
        del self._followers[req_id]
        path, _, _ = self.tree.peek(follower.ids, follower.extra_key)
        anchor = path[-1] if path else self.tree.root
        done = sum(len(node.key) for node in path)
        rest = RadixKey.from_validated(follower.ids[done:], follower.extra_key)
        return not self.prefetch(req_id, anchor, rest)

    def pop_loaded(self, req_id: str) -> int:
        check_req_id(req_id)
        return self._loaded.pop(req_id, 0)

    def abort(self, req_id: str) -> None:
        check_req_id(req_id)
        self._followers.pop(req_id, None)
        request = self._requests.pop(req_id, None)
        if request is not None:
            self._leaders.pop(request.lead_key, None)
            request.op.cancel()
            self.reads.retire(request.op)

    def _finish(self, req_id: str, request: PrefetchRequest, pages: int) -> None:
        """End ``request``, adopting its first ``pages`` pages (read on every rank)."""
        del self._requests[req_id]
        self._leaders.pop(request.lead_key, None)
        _, read = request.op.cancel()
        pages, state = min(pages, read), None
        if pages and self.states is not None:  # a recurrent model resumes only at a state
            pages, state = self.states.fetch(request.hashes, pages)
        leaf = adopt_pages(self.tree, self.host, self.backups, request, pages, self._clock)
        if self.states is not None and state is not None:
            self.states.place(leaf, state)
        adopted = 0 if leaf is None else len(leaf.key)
        self._loaded[req_id] = adopted
        self._loaded_tokens += adopted
        self.reads.retire(request.op)

    def _start_reads(self) -> None:
        """Read or end each prefetch whose query every rank has answered (``PrefetchReads``)."""
        undecided = [r for r in self._requests.values() if not r.decided]
        if undecided:
            decided = self.reads.decide([r.op for r in undecided])
            for request, done in zip(undecided, decided, strict=True):
                request.decided = done

    # ---- backup (``StorageBackups``, ``StorageTiering``) -------------------------------------

    def pins(self, node: TreeNode) -> bool:
        return self.backups.pins(node)

    def reading(self, slots: Slots) -> bool:
        return self.backups.reading(slots)

    def backed_up(self, node: TreeNode) -> None:
        self.tiering.backed_up(node)

    def victims(self, leaves: LeafSet) -> Iterator[TreeNode]:
        return self.tiering.victims(leaves)

    # ---- polling, draining, stats ------------------------------------------------------------

    def poll(self) -> None:
        """Process finished backups, start the reads answered queries allow, release retired
        slots (never blocks)."""
        self.backups.poll()
        self._start_reads()
        self.reads.release_retired()

    def step(self) -> None:
        """``poll``, then the exclusive tiering's ``write_ahead`` (once per scheduler step)."""
        self.poll()
        host = self.host
        self.tiering.write_ahead(host.leaves, host.size(), host.controller.mem_pool_host.size)

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
        return bool(self.backups.pending() or self.reads.retiring()) or any(
            r.op.progress()[0] in running for r in self._requests.values()
        )

    def clear(self) -> None:
        """Cancel every prefetch, wait for the threads (each backend call bounded), release
        every reserved slot, those a timed-out read still holds too."""
        for req_id in [*self._requests, *self._followers]:
            self.abort(req_id)
        self.settle()
        self.reads.give_up()
        self._loaded.clear()
        self.backups.clear()

    def close(self) -> None:
        self.clear()
        self.io.close()
        if self.states is not None:
            self.states.close()

    def stats(self) -> StorageTierStats:
        return StorageTierStats.of(
            self.storage.stats(),
            prefetches=self._prefetches,
            prefetch_revoked=self.reads.revoked,
            prefetch_skipped_slower=self.reads.slower,
            prefetch_loaded_tokens=self._loaded_tokens,
            backup_pages=self.backups.written_pages,
            eviction_write_pages=self.backups.demoted_pages,
            eviction_dropped_pages=self.tiering.dropped_pages,
            pending_prefetches=len(self._requests) + len(self._followers),
            pending_backups=self.backups.pending(),
        )
