"""StorageTiering: how the storage tier relates to the host tier above it
(``StorageConfig.tiering``, one of ``hicache.controller.TIERINGS``).

- ``inclusive`` (default): a node's pages are written to storage when its host write lands
  (``StorageBackups.backed_up``), so storage holds a superset of the host tier; the host tier
  evicts its leaves in policy order and drops them.
- ``exclusive`` (SGLang's opt-in L2->L3 tiering, sgl-project/sglang#39845): a host write landing
  writes nothing; storage is written from the host tier's evictions, so the two tiers hold
  different pages and storage is an overflow layer of the host. ``victims`` hands
  ``HostTier.evict`` its leaves: one whose pages storage is known to hold
  (``StorageBackups.stored``: written before, or prefetched from it) is evicted at once, never
  written again (dedup); any other has its write queued (``demote``: pinned until written) and
  eviction goes on with the next leaf; when the leaves run out with writes in flight, it waits
  for them (``StorageBackups.settle``) and evicts the leaves written. A leaf whose write failed
  (a backend fault, an open breaker, a cancelled chain) is then evicted anyway, its pages lost
  (``dropped_pages``): it leaves the tree, so nothing can match or serve it. ``write_ahead``
  (each scheduler step) queues the writes of the coldest leaves once the host tier holds more
  than ``HIGH_WATERMARK`` of its pool, so an eviction rarely waits.

Under both, a storage hit (a prefetch into the host) leaves the object in the store: the store
may be shared by other instances and evicts by its own cap (SGLang does the same). Dedup trusts
the pages remembered (``StorageBackups.remember``); a page the store evicted on its own is
forgotten at the next poll (``StorageBackups.evicted``, one rank) and written again. Before
that poll, or under TP (where it stays remembered), such a page is dropped rather than written
(a later miss, never a wrong page).

Under TP every decision here reads only the tree and the backups' agreed state (pins and
remembered pages change only in agreed polls), so every rank evicts, writes and waits alike.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from hicache.controller import check_tiering
from hicache.radix.node import TreeNode
from hicache.radix.policies import LeafSet
from hicache.tiers.storage.storage_backup import StorageBackups

HIGH_WATERMARK = 0.9  # host tier fill (of its pool) above which ``write_ahead`` writes
AHEAD_LEAVES = 32  # the most node writes ``write_ahead`` keeps in flight


class StorageTiering:
    """The host tier's evictions under ``tiering`` (see the module docstring), through
    ``backups``."""

    def __init__(self, backups: StorageBackups, tiering: str) -> None:
        self.backups = backups
        self.exclusive = check_tiering(tiering) == "exclusive"
        self.dropped_pages = 0  # pages evicted from the host after their write failed

    def backed_up(self, node: TreeNode) -> None:
        """``node``'s host write landed: inclusive writes its path now, exclusive nothing."""
        if not self.exclusive:
            self.backups.backed_up(node)

    def victims(self, leaves: LeafSet) -> Iterator[TreeNode]:
        """The host leaves ``HostTier.evict`` may delete now, taken from ``leaves`` in policy
        order as it asks for them; may block on storage writes (exclusive)."""
        if not self.exclusive:
            return iter(leaves.pop, None)
        return self._exclusive_victims(leaves)

    def _exclusive_victims(self, leaves: LeafSet) -> Iterator[TreeNode]:
        backups, tried = self.backups, set()  # ``tried``: node ids whose write this run queued
        while True:
            node = leaves.pop()
            if node is None:
                if not backups.pending():
                    return
                backups.settle()  # the written leaves come back to ``leaves``
            elif backups.stored(node):
                yield node
            elif node.id in tried:  # its write failed: drop it
                self.dropped_pages += len(node.key) // backups.page_size
                yield node
            else:
                tried.add(node.id)
                backups.demote(node)

    def write_ahead(self, leaves: LeafSet, size: int, capacity: int) -> None:
        """Under exclusive, when the host tier holds ``size`` of ``capacity`` tokens, more than
        ``HIGH_WATERMARK``: queue the writes of the coldest ``leaves`` not in storage, keeping at
        most ``AHEAD_LEAVES`` node writes in flight."""
        room = AHEAD_LEAVES - self.backups.pending()
        if not self.exclusive or size <= HIGH_WATERMARK * capacity or room <= 0:
            return
        stored = self.backups.stored
        todo = [node for node in itertools.islice(leaves, room) if not stored(node)]
        for node in todo:  # after the scan: ``demote`` files the node out of ``leaves``
            self.backups.demote(node)
