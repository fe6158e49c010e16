"""StorageBackups: the backup half of the storage tier — host pages written to storage in prefix
order, each node pinned on the host until storage has acknowledged it.

Inclusive tiering (``storage_tiering``): on each host write ack (``backed_up``), every node from
the root down whose pages are not yet queued is queued, parents first, on the single backup
thread, so a prefix reaches storage without holes. A backup whose parent page is still being
written is queued ``after`` it (``_writing``): when the parent's write fails, the children's
queued writes are cancelled, and all of them are forgotten, to be retried with the parent when a
host write on their path is acknowledged again. The pages queued or present are remembered by
hash (``known``: split-proof, as a split divides a node's hashes), the oldest forgotten first
past ``KNOWN_PAGES_MAX``: a forgotten page is at worst written again, and ``batch_set_v1`` skips
what is present. Exclusive tiering: a host leaf being evicted is queued alone (``demote``)
unless ``stored``, and eviction may wait for it (``settle``).

Under TP a node is unpinned on every rank in the same poll, once its backup has finished on all
of them (the fewest finished, in queue order), and a page any rank failed to write is forgotten
on all, so every rank pins, and so host-evicts, alike. MLA ranks other than 0 write nothing but
queue empty backups, to pin as rank 0 does. A failed backup's node stays pinned while a
timed-out write still reads its host slots (``held``: the guard's ``held_slots``), so they are
not reused under it; ``pending`` does not count it, and ``clear`` gives it up.

A hybrid model: a node whose host SWA KV is gone (``host_swa_gone``: backed up while
tombstoned) is not written, nor anything below it (a chain break, as a failed write), so every
stored page's SWA bytes are valid (under the default ``write_through`` a node is backed up at
insert, before any tombstone, so this is rare). With ``states`` (``StateStorage``) a node's
host state is written on the backup thread after its pages (``_after_pages``), or, gained
after they were queued, by a backup of no pages queued after them (``state_gained``).

KV events (``events``, ``medium``): each page a backup wrote is announced (``BlockStored``) on
the backup thread as soon as the write returns, and each page the backend evicted
(``evicted``, its ``on_evict``) on the thread that evicted it, so the two come in the order the
store changed.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch

from hicache.backends import StorageKeys
from hicache.backends.deadline import touches
from hicache.backends.io import Backup, StorageIO
from hicache.radix.components import host_swa_gone
from hicache.radix.events import BlockStored, Medium, NodeEvents
from hicache.radix.node import TreeNode
from hicache.radix.page_hash import node_hashes
from hicache.radix.slots import Slots, as_tensor
from hicache.radix.tree import RadixTree
from hicache.tiers.host.host_tier import HostTier
from hicache.tiers.storage.state_storage import StateStorage, StateWrite
from hicache.tp import TPGroup

KNOWN_PAGES_MAX = 1 << 20


class _Tag(NamedTuple):
    """A backup's ``tag``: its node and the page hashes it writes (the node may split later);
    ``demoted``: written because the host tier evicts the node (``demote``), not on its host
    write's ack (``backed_up``)."""

    node: TreeNode
    hashes: list[bytes]
    demoted: bool


class StorageBackups:
    """Backups to storage of ``tree``'s host copies (``host``) through ``io``; KV events of
    ``medium`` to ``events`` (None: off)."""

    def __init__(
        self,
        tree: RadixTree,
        host: HostTier,
        io: StorageIO,
        keys: StorageKeys,
        page_size: int,
        events: NodeEvents | None = None,
        medium: Medium = "DISK",
        held: Callable[[], torch.Tensor] | None = None,
    ) -> None:
        self.tree, self.host, self.io, self.keys = tree, host, io, keys
        self.held = held  # host slots of timed-out backend calls still running (None: never)
        self._held: list[Backup] = []  # failed, their nodes pinned while ``held`` has their slots
        self.page_size, self.events, self.medium = page_size, events, medium
        self.tp: TPGroup = host.tp
        self._queued: deque[Backup] = deque()  # in flight, in queue order
        self._landed: list[Backup] = []  # finished here (a prefix of ``_queued``), not processed
        self._pinned: dict[int, TreeNode] = {}  # nodes with a backup in flight, by id
        self._pins: Counter[int] = Counter()  # node id -> its backups in flight
        self._known: OrderedDict[bytes, None] = OrderedDict()
        self._gone: deque[bytes] = deque()  # pages the backend evicted (any thread), to forget
        self._writing: dict[bytes, tuple[Backup, int]] = {}  # page hash -> backup in flight
        self.written_pages = 0  # pages present in storage after a backup (counter)
        self.demoted_pages = 0  # of those, the pages written by ``demote`` (counter)
        self.states: StateStorage | None = None  # a hybrid model's recurrent states

    def pins(self, node: TreeNode) -> bool:
        return node.id in self._pinned

    def reading(self, slots: Slots) -> bool:
        """Whether a backup in flight (or a failed one a timed-out write holds) reads any of
        the host ``slots`` (a node may have split since its backup was queued)."""
        held = as_tensor(slots)
        return any(touches(op.host_indices, held) for op in (*self._queued, *self._held))

    def pending(self) -> int:
        """Node backups in flight (not the failed ones kept pinned by a timed-out write)."""
        return self._pins.total() - len(self._held)

    def backed_up(self, node: TreeNode) -> None:
        """Queue storage writes for the nodes from the root to ``node`` not yet queued."""
        if not self.keys.writes and not self.tp.active:
            return
        prior: bytes | None = None  # the last page hash above ``n``
        for n in reversed(self.tree.path_to_root(node)):
            if n.host_slots is None and self.host.exclusive:
                prior = None  # on the device only: storage takes it when it moves down
                continue
            if n.host_slots is None or host_swa_gone(n.comp):
                return  # prefix order: nothing below a node storage cannot get from the host
            hashes = node_hashes(n, self.page_size)
            if hashes[-1] not in self._known:
                self._queue(n, hashes, None if prior is None else self._writing.get(prior))
            prior = hashes[-1]

    def stored(self, node: TreeNode) -> bool:
        """Whether every page of ``node`` is known to be in storage or queued for it (always,
        on a rank that writes nothing and has no peers to pin alike: MLA ranks other than 0)."""
        if not self.keys.writes and not self.tp.active:
            return True
        known = self._known
        return all(h in known for h in node_hashes(node, self.page_size))

    def demote(self, node: TreeNode) -> None:
        """Pin the host-only leaf ``node`` the host tier is evicting and queue the write of its
        pages (exclusive tiering: its ancestors are not written), after its parent's last
        page's backup when that is in flight."""
        parent = node.parent
        assert parent is not None, "demote of the root"
        prior = None if parent is self.tree.root else node_hashes(parent, self.page_size)[-1]
        after = None if prior is None else self._writing.get(prior)
        self._queue(node, node_hashes(node, self.page_size), after, demoted=True)

    def settle(self) -> None:
        """Block until the backup thread has run every queued write; process them (``poll``)."""
        self.io.drain_backups()
        self.poll()

    def _queue(
        self,
        node: TreeNode,
        hashes: list[bytes],
        after: tuple[Backup, int] | None,
        demoted: bool = False,
    ) -> None:
        """Pin ``node`` and queue the write of its pages ``hashes`` ``after`` its parent page's
        backup (None: not in flight); ``demoted``: see ``_Tag``."""
        assert node.host_slots is not None, "a backup of a node not on the host"
        self.remember(hashes)
        self._pinned[node.id] = node
        self._pins[node.id] += 1
        self.host.refile(node)
        keys = self.keys.page_keys(hashes) if self.keys.writes else []
        tag = _Tag(node, hashes, demoted)
        op = Backup(tag, keys, as_tensor(node.host_slots), self._on_done(node), after)
        self._writing.update((h, (op, i)) for i, h in enumerate(hashes))
        self._queued.append(op)
        self.io.backup(op)

    def state_gained(self, node: TreeNode) -> None:
        """``node``'s host copy gained a state: when its pages are already queued or stored,
        queue the state's write (a backup of no pages, after theirs)."""
        hashes = node_hashes(node, self.page_size)
        if self.states is not None and node.host_slots is not None and hashes[-1] in self._known:
            self._queue(node, [], self._writing.get(hashes[-1]))

    def _on_done(self, node: TreeNode) -> partial[None] | None:
        """What runs once ``node``'s pages are written: its state's write, then the events."""
        announce = self._announcer(node)
        job = None if self.states is None else self.states.pending_write(node)
        return announce if job is None else partial(self._after_pages, job, announce)

    def _after_pages(self, job: StateWrite, announce: partial[None] | None, op: Backup) -> None:
        """Backup thread: announce the pages, then write the state when every page was
        written (and the chain is intact)."""
        assert self.states is not None
        if announce is not None:
            announce(op)
        if not op.parent_missing() and op.written_pages == len(op.keys):
            self.states.write(job)

    def _announcer(self, node: TreeNode) -> partial[None] | None:
        """What announces ``node``'s written pages (built now: the node may split later)."""
        if self.events is None:
            return None
        return partial(self._announce, self.events.stored_events(node, self.medium))

    def _announce(self, stored: list[BlockStored], op: Backup) -> None:
        assert self.events is not None
        for event in stored[: op.written_pages]:
            self.events.sink.publish(event)

    def evicted(self, page_keys: list[str]) -> None:
        """The backend removed ``page_keys`` (any thread): announce this model's and shard's,
        and forget them at the next ``poll`` so a later backup writes them again. Under TP they
        stay known (each rank's store evicts on its own, and what is known decides the pins
        every rank must take alike): such a page is a miss until it ages out of the known set."""
        hashes = [h for h in map(self.keys.page_hash, page_keys) if h is not None]
        if not self.tp.active:
            self._gone.extend(hashes)
        if self.events is not None:
            self.events.removed_pages(hashes, self.medium)

    def remember(self, hashes: list[bytes]) -> None:
        """Pages ``hashes`` are in storage (or queued for it)."""
        known = self._known
        for h in hashes:
            known[h] = None
        while len(known) > KNOWN_PAGES_MAX:
            known.popitem(last=False)

    def poll(self) -> None:
        """Process the backups every rank has finished: unpin their nodes (the host may evict
        them again); forget the pages of those a rank could not store, and those the backend
        evicted."""
        while self._gone:
            self._known.pop(self._gone.popleft(), None)
        self._landed.extend(self.io.finished_backups())
        if self._queued:
            self._process_landed()
        if self._held:
            self._release_held(None)

    def _process_landed(self) -> None:
        failed = [int(op.written_pages < len(op.keys)) for op in self._landed]
        failed += [0] * (len(self._queued) - len(failed))
        (count,), failed = self.tp.agree([len(self._landed)], failed, where="storage backups")
        for i in range(count):
            op = self._queued.popleft()
            self.written_pages += op.written_pages
            self.demoted_pages += op.written_pages if op.tag.demoted else 0
            self._written(op, bool(failed[i]))
            if failed[i]:
                self._held.append(op)  # unpinned once no timed-out write reads its slots
            else:
                self._unpin(op)
        del self._landed[:count]

    def _release_held(self, held: torch.Tensor | None) -> None:
        """Unpin the failed backups' nodes whose slots no rank's timed-out write still reads
        (``held``; None: ask ``self.held``)."""
        if held is None:
            held = torch.empty(0, dtype=torch.int64) if self.held is None else self.held()
        mine = [int(not touches(op.host_indices, held)) for op in self._held]
        free, _ = self.tp.agree(mine, where="storage held backups")
        for op, ok in zip(self._held, free, strict=True):
            if ok:
                self._unpin(op)
        self._held = [op for op, ok in zip(self._held, free, strict=True) if not ok]

    def _unpin(self, op: Backup) -> None:
        node = op.tag.node
        self._pins[node.id] -= 1
        if not self._pins[node.id]:
            del self._pins[node.id], self._pinned[node.id]
            self.host.refile(node)

    def _written(self, op: Backup, failed: bool) -> None:
        """``op`` has ended: its pages wait on it no more; failed (or cancelled), they were not
        stored, so a later backup tries again."""
        for h in op.tag.hashes:
            if self._writing.get(h, (None,))[0] is op:
                del self._writing[h]
            if failed:
                self._known.pop(h, None)

    def clear(self) -> None:
        """Forget what storage holds (the caller has waited for the backups); unpin the nodes
        timed-out writes still read (the cache stops waiting for a hung backend)."""
        if self._held:
            self._release_held(torch.empty(0, dtype=torch.int64))
        assert not self._pinned, "clear with backups in flight"
        self._known.clear()
        self._writing.clear()
        self._queued.clear()
        self._landed.clear()
