"""HostBackup: how a ``HostTier`` queues backups (device -> host copies of tree nodes).

A node is backed up by reserving its host slots in the host pool and queueing the copy on the
controller (``HiCacheController.write``); the node stays locked (one transfer lock, see
``tier``) until the write's ack is processed (``HostTier.step``). The host pool's shortage is
met by evicting host-only leaves first; under TP the ranks agree on how many of a path's
backups got host slots (the fewest), so every rank queues the same ones.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hicache.radix.events import HOST
from hicache.radix.node import TreeNode
from hicache.tiers.host.host_storage_slots import StorageSlots
from hicache.tiers.host.in_flight import InFlight
from hicache.tp import TPGroup


class HostBackup(StorageSlots):
    """Mixed into ``HostTier``, which owns the state named below (and ``StorageSlots``')."""

    tp: TPGroup
    exclusive: bool
    _solo: bool  # one rank (or agreement off): nothing to agree
    _backup_hits: int | None  # ``HiCacheConfig.backup_hits`` (None: backups only on eviction)
    _backup_tokens: int
    _flight: InFlight
    _slots_on_device: Callable[[torch.Tensor], torch.Tensor]  # the allocator's ``SlotIds``

    def backup_path(self, last: TreeNode, path: list[TreeNode] | None = None) -> None:
        """Back up the device nodes from the root to ``last`` (``path`` when the caller has
        them) whose hit count reached the write threshold, parents first; stop at the first
        the host cannot take.

        A path with a node to back up has no host-only node (under inclusive tiering a
        host-only node's ancestors are all backed up; exclusive tiering backs up nothing
        here), so the ``evict`` a backup may run cannot delete part of it."""
        hits = self._backup_hits
        if hits is None:
            return
        todo, tokens = [], 0
        for node in reversed(self.site.path_to_root(last)) if path is None else path:
            if node.host_slots is not None:
                continue
            if node.slots is None or node.hit_count < hits:
                break
            todo.append(node)
            tokens += len(node.key)
        if todo:
            self._backup(todo, tokens)

    def write_back(self, node: TreeNode) -> bool:
        """Under ``write_back``, queue backups of a leaf being evicted without a host copy and
        of its ancestors lacking one (parents first); under exclusive tiering, of that leaf
        only. False when that does not apply or the host cannot take them all even after
        ``evict`` (the caller then deletes the leaf); then nothing is queued, unless the host
        pool refused an allocation it had room for: the part already queued stays locked until
        a later call issues its writes."""
        if node.host_slots is not None or self._backup_hits is not None:
            return False
        path = [node] if self.exclusive else self.site.path_to_root(node)
        chain = [n for n in path if n.host_slots is None]
        tokens = sum([len(n.key) for n in chain])
        if not self.make_room(tokens):
            return False
        return self._backup(chain[::-1], tokens) == len(chain)

    def _backup(self, nodes: list[TreeNode], tokens: int) -> int:
        """Queue backups of the device nodes ``nodes`` (parents first, ``tokens`` in all), each
        locked until its ack: as many leading ones as the host pool takes on every rank (after
        evicting host-only leaves when short); returns how many (the rest: nothing changed)."""
        pool = self.controller.mem_pool_host
        if pool.available_size() < tokens:  # ``make_room``'s test, without its call
            self.make_room(tokens)
        got = []
        for node in nodes:
            host = pool.alloc(len(node.key))
            if host is None:  # short, or a refusal: each node's allocation is tried once
                break
            got.append(host)
        count = len(got)
        if not self._solo:
            (count,), _ = self.tp.agree([count], where="host backup allocation")
        for host in got[count:]:
            pool.free(host)
        for node, host in zip(nodes, got[:count], strict=False):
            self._queue_write(node, host)
        return count

    def _queue_write(self, node: TreeNode, host: torch.Tensor) -> None:
        assert node.slots is not None and node.host_slots is None, "backup of a wrong node"
        # the slots carrying their CPU copy (no device read to plan the backup): a view, as a
        # node's stored slots are never written in place (a split or a load rebinds them)
        slots = self._slots_on_device(torch.from_numpy(node.slots))
        self.controller.write(slots, node.id, host, trusted=True)  # the tree's and the pool's
        node.host_slots = host.numpy()  # a fresh CPU tensor from the host pool: its memory
        if self.site.watch is not None:
            self.site.watch.backed_up(node)
        if self.events is not None:
            self.events.stored(node, HOST)
        n = len(node.key)
        self._size += n
        self._backup_tokens += n
        self.site.lock(node)
        self._flight.writing[node.id] = node
        self._flight.queued_tokens[node.id] = n
