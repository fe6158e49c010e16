"""HostFreeing: how a ``HostTier`` frees host copies.

Host eviction deletes host-only leaves; ``drop_subtree`` deletes a subtree (integrity drops, a
device leaf's host-only children under exclusive tiering). Under exclusive tiering
(``HiCacheConfig.tiering``) a node that holds a device copy gives its host copy back once no
transfer reads it (``shed``): the chain of a load-back when the load has landed on every rank,
a host-only node an insert gave the caller's device slots. A host copy a storage write still
reads (``BelowHost.reading``) waits in ``shedding`` and is freed at a later settle; so under
exclusive tiering a node holds both copies only while a transfer reads one (``settling``).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from hicache.controller import HiCacheController
from hicache.radix.events import HOST, NodeEvents
from hicache.radix.node import TreeNode
from hicache.radix.policies import LeafSet
from hicache.radix.slots import Slots, concat_slots
from hicache.radix.tier import BelowHost, TierSite
from hicache.tiers.host.in_flight import InFlight

_CPU = torch.device("cpu")


def _both(node: TreeNode) -> bool:
    return node.slots is not None and node.host_slots is not None


class HostFreeing:
    """Mixed into ``HostTier``, which owns the state named below."""

    controller: HiCacheController
    site: TierSite
    events: NodeEvents | None
    below: BelowHost | None
    leaves: LeafSet
    exclusive: bool
    _flight: InFlight
    _size: int
    _evicted_tokens: int
    _shedding: dict[int, TreeNode]  # nodes whose host copy waits for a storage write to end
    _loads: dict[int, tuple[TreeNode, TreeNode]]  # load in flight: last id -> (last, above)
    _later: dict[int, TreeNode]  # move-downs whose eviction failed: finished when written

    def refile(self, node: TreeNode) -> None:
        raise NotImplementedError  # ``HostTier.refile``

    def victims(self) -> Iterator[TreeNode]:
        """The leaves ``evict`` deletes, popped in order as it asks: the storage tier's say
        (``BelowHost.victims``: under exclusive tiering it writes some first), else all."""
        return (
            iter(self.leaves.pop, None) if self.below is None else self.below.victims(self.leaves)
        )

    def evict(self, num_tokens: int) -> int:
        freed: list[Slots] = []
        count = 0
        victims = self.victims()
        while count < num_tokens:
            node = next(victims, None)
            if node is None:
                break
            assert node.host_slots is not None and node.slots is None
            freed.append(node.host_slots)
            count += len(node.key)
            if self.events is not None:
                self.events.removed(node, HOST)
            self.site.delete_leaf(node)
        self._size -= count
        self._evicted_tokens += count
        if freed:
            self.controller.evict_host(concat_slots(freed, _CPU))
        return count

    def drop_subtree(self, top: TreeNode) -> None:
        """Delete ``top`` and its descendants from the tree, freeing their device and host
        slots. They must be unlocked, with no transfer pending (a host-only node's descendants
        are host-only)."""
        if self.below is not None:
            self.below.settle()
        nodes, stack = [], [top]
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        host: list[Slots] = []
        for node in reversed(nodes):  # every node after its descendants: a leaf when deleted
            assert node.lock_ref == 0 and node.host_slots is not None, "dropping a wrong node"
            self._shedding.pop(node.id, None)
            host.append(self._forget(node))
            if node.slots is not None:
                self.site.drop_device(node)  # also files it out of both leaf sets
            self.site.delete_leaf(node)
        self.controller.evict_host(concat_slots(host, _CPU))

    def drop_children(self, node: TreeNode) -> None:
        """Before the device leaf ``node`` without a host copy is deleted: drop the host-only
        subtrees below it (only exclusive tiering hangs host-only nodes below such a node)."""
        for child in list(node.children.values()):
            self.drop_subtree(child)

    # ---- exclusive tiering -------------------------------------------------------------------

    def shed(self, nodes: list[TreeNode]) -> None:
        """Under exclusive tiering, free the host copy of each of ``nodes`` holding both copies
        (no transfer of this tier may read them); one a storage write reads waits in
        ``shedding``. A no-op under inclusive tiering."""
        if not self.exclusive:
            return
        freed: list[Slots] = []
        for node in nodes:
            host = node.host_slots
            if node.slots is not None and host is not None and self._read_below(host):
                self._shedding[node.id] = node
                continue
            self._shedding.pop(node.id, None)
            if node.slots is not None and host is not None:
                freed.append(self._forget(node))
        if freed:
            self.controller.evict_host(concat_slots(freed, _CPU))

    def move_down_later(self, nodes: list[TreeNode]) -> None:
        """Under exclusive tiering: the writes of ``nodes`` (queued to move them down) outlive
        the eviction that queued them (it raised); finish each move when its write lands."""
        if self.exclusive:
            self._later.update((node.id, node) for node in nodes)

    def finish_moves(self, written: list[TreeNode]) -> None:
        """Of the ``written`` nodes (just unlocked), finish those ``move_down_later`` named,
        and the nodes a split put above them: each drops its device copy when it is an
        unlocked device leaf, else its host copy."""
        for node in written:
            if self._later.pop(node.id, None) is None:
                continue
            for n in self._shedding_run(node, self._in_transfer()):
                if not n.lock_ref and all(c.slots is None for c in n.children.values()):
                    self.site.drop_device(n)
                else:
                    self.shed([n])

    def _read_below(self, host: Slots) -> bool:
        return self.below is not None and self.below.reading(host)

    def shed_inserted(self, path: list[TreeNode]) -> None:
        """After an insert along ``path``: its unlocked nodes holding both copies got the
        caller's device slots (a node in transfer is locked); shed their host copies."""
        if self.exclusive:
            self.shed([n for n in path if not n.lock_ref and _both(n)])

    def retry_shedding(self) -> None:
        """Shed what ``shedding`` holds, and the nodes a split put above them."""
        if not self._shedding:
            return
        waiting, busy = list(self._shedding.values()), self._in_transfer()
        self._shedding.clear()
        self.shed([n for node in waiting for n in self._shedding_run(node, busy)])

    def settling(self) -> set[int]:
        """Ids of the nodes allowed to hold both copies under exclusive tiering: being
        written, in the chain of a load in flight, or waiting in ``shedding`` (with the nodes
        a split put above them)."""
        busy = self._in_transfer()
        for node in self._shedding.values():
            busy.update(n.id for n in self._shedding_run(node, busy))
        return busy

    def _in_transfer(self) -> set[int]:
        """Ids of the nodes being written (with the nodes a split put above them) or in the
        chain of a load in flight."""
        busy: set[int] = set()
        for node in self._flight.pending()["write"]:
            busy.update(n.id for n in self._shedding_run(node, set()))
        for last, above in self._loads.values():
            busy.update(n.id for n in self.load_chain(last, above))
        return busy

    def load_chain(self, last: TreeNode, above: TreeNode) -> list[TreeNode]:
        """The nodes a load ending at ``last`` gave device copies: ``last`` up to, not
        including, ``above`` (the deepest device node when it was queued; splits included)."""
        chain = []
        for node in self.site.path_to_root(last):
            if node is above:
                break
            chain.append(node)
        return chain

    def _shedding_run(self, node: TreeNode, busy: set[int]) -> list[TreeNode]:
        """``node`` (when still in the tree) and its ancestors holding both copies, up to the
        first that does not or is in ``busy``."""
        if node.parent is None:
            return []  # deleted meanwhile
        run = []
        for n in self.site.path_to_root(node):
            if not _both(n) or n.id in busy:
                break
            run.append(n)
        return run

    def _forget(self, node: TreeNode) -> Slots:
        """Take ``node``'s host copy out of the tree (the caller frees the returned slots)."""
        host = node.host_slots
        assert host is not None
        if self.events is not None:
            self.events.removed(node, HOST)
        node.host_slots = None
        self._size -= len(node.key)
        self.refile(node)
        return host
