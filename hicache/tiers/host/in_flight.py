"""InFlight: the nodes of a ``HostTier`` awaiting a write or a load ack, and their release.

Each such node holds one transfer lock (``tier``) until its ack is processed here. Acks finish
in issue order, and a node is recorded when its transfer is queued, so on each rank the nodes
whose ack has finished are a prefix of ``writing`` (and of ``loading``) in insertion order.
Under TP that prefix differs between ranks (a transfer lands sooner on one), so a release
takes the shortest prefix over the ranks (``TPGroup.agree``): a node is released on every rank
in the same call, once its transfer has landed on all of them.

A node may give up device slots its pending write still reads (a hybrid node revived with a
request's slots, ``HybridRadixCache._revive``): they are ``held`` under the writing node and
go back to the allocator with its release, never sooner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from hicache.controller import HiCacheController, pop_finished_acks
from hicache.radix.node import TreeNode
from hicache.radix.slots import Slots
from hicache.tp import TPGroup

T = TypeVar("T")


class InFlight:
    """Transfers in flight, by node; see the module docstring."""

    def __init__(self, tp: TPGroup) -> None:
        self.tp = tp
        self._solo = not tp.active  # one rank (or agreement off): nothing to agree
        self.writing: dict[int, TreeNode] = {}  # node id -> node, in queueing order
        self.queued_tokens: dict[int, int] = {}  # writing node id -> its tokens when queued
        self.loading: dict[int, TreeNode] = {}
        self.held: dict[int, list[Slots]] = {}  # writing node id -> device slots its write reads
        self._landed: tuple[set[int], set[int]] = (set(), set())  # ids not yet released

    def settle(
        self, controller: HiCacheController, issue: Callable[[], T], where: str
    ) -> tuple[T | None, list[TreeNode], list[TreeNode]]:
        """Run ``issue`` (a controller call issuing or waiting for transfers), pop the finished
        acks, and return ``issue``'s result with the written and the loaded nodes every rank
        has finished, in order (their locks are the caller's to drop). When ``issue`` raises,
        nothing is released: on one rank the exception propagates at once, under TP after the
        agreement (the other ranks raise ``TPPeerError``). With nothing in flight (then on
        every rank: only agreed calls add or remove nodes here) there is nothing to agree and
        no collective is issued."""
        failed: Exception | None = None
        result: T | None = None
        try:
            result = issue()
        except Exception as exc:  # passed on through the agreement, re-raised there
            if self._solo:
                raise
            failed = exc
        queues = (controller.ack_write_queue, controller.ack_load_queue)
        if queues[0] or queues[1]:  # else no batch is left whose busy time is unresolved
            waits = (self.writing, self.loading)
            for queue, waiting, landed in zip(queues, waits, self._landed, strict=True):
                for ack in pop_finished_acks(queue) if queue else ():
                    landed.update(waiting.keys() & ack.node_ids)
            # the busy time of the batches that landed (no wait): an ack is popped only once
            # its batch's clock has landed, so this resolves every batch whose ack is gone
            controller.counters.settle()
        if not self.writing and not self.loading:  # so on every rank: nothing to agree
            if failed is not None:
                raise failed
            return result, [], []
        wrote, loaded = self._landed
        local = [
            self._prefix(self.writing, wrote) if wrote else 0,
            self._prefix(self.loading, loaded) if loaded else 0,
        ]
        writes, loads = local
        if not self._solo:
            (writes, loads), _ = self.tp.agree(local, where=where, failed=failed)
        written = self._release(self.writing, wrote, writes) if writes else []
        for node in written:
            del self.queued_tokens[node.id]
        return result, written, self._release(self.loading, loaded, loads) if loads else []

    def pending(self) -> dict[str, list[TreeNode]]:
        """The nodes awaiting a ``"write"`` and a ``"load"`` ack, in queueing order."""
        return {"write": list(self.writing.values()), "load": list(self.loading.values())}

    def written(self) -> list[TreeNode]:
        """Every node whose host copy a pending write fills: each writing node and the nodes
        a split has put above it since its write was queued (they hold the tokens it had)."""
        return [piece for _, piece in self._pieces()]

    def writer_of(self, node: TreeNode) -> TreeNode | None:
        """The writing node whose pending write fills ``node``'s host copy (``written``), or
        None when no pending write reads ``node``'s device slots."""
        return next((writer for writer, piece in self._pieces() if piece is node), None)

    def unhold(self, writers: Iterable[TreeNode]) -> list[Slots]:
        """Forget and return the device slots ``held`` under ``writers`` (to be freed)."""
        return [slots for node in writers for slots in self.held.pop(node.id, ())]

    def _pieces(self) -> Iterator[tuple[TreeNode, TreeNode]]:
        """(writing node, piece) for every piece of ``written``, in queueing order."""
        for node_id, node in self.writing.items():
            piece: TreeNode | None = node
            left = self.queued_tokens[node_id]
            while left > 0 and piece is not None:
                yield node, piece
                left -= len(piece.key)
                piece = piece.parent

    def cancel_load(self, last: TreeNode) -> None:
        """Forget the load ending at ``last``: it has landed on every rank and is not served."""
        del self.loading[last.id]
        self._landed[1].discard(last.id)

    def clear(self) -> None:
        self.writing.clear()
        self.queued_tokens.clear()
        self.held.clear()
        self.loading.clear()
        for landed in self._landed:
            landed.clear()

    @staticmethod
    def _prefix(waiting: dict[int, TreeNode], landed: set[int]) -> int:
        count = 0
        for node_id in waiting:
            if node_id not in landed:
                break
            count += 1
        return count

    @staticmethod
    def _release(waiting: dict[int, TreeNode], landed: set[int], count: int) -> list[TreeNode]:
        ids = list(waiting)[:count]
        landed.difference_update(ids)
        return list(map(waiting.pop, ids))
