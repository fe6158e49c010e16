"""HostLoads: how a ``HostTier`` loads host-only chains back to the device.

``chain`` finds what ``init_load_back`` loads, ``load`` queues it in the controller and gives
its nodes their new device slots (each keeps its host copy; the last node keeps the caller's
lock as a transfer lock until the load's ack), ``cancel_load`` releases a landed load that is
not served (a failed verification). ``idle`` tells the per-step settle when it has nothing to
do. These run on the scheduler's path of every step with a host hit: plain loops, no
comprehension or helper per node.
"""

from __future__ import annotations

import numpy as np
import torch

from hicache.controller import HiCacheController
from hicache.devices import host_copy
from hicache.radix.node import TreeNode
from hicache.radix.tier import TierSite
from hicache.tiers.host.in_flight import InFlight
from hicache.tp import TPGroup


class HostLoads:
    """Mixed into ``HostTier``, which owns the state named below."""

    controller: HiCacheController
    site: TierSite
    tp: TPGroup
    _flight: InFlight
    _shedding: dict[int, TreeNode]
    _loads: dict[int, tuple[TreeNode, TreeNode]]  # load in flight: last id -> (last, above)
    _later: dict[int, TreeNode]
    _load_backs: int
    _load_back_tokens: int

    def chain(self, node: TreeNode) -> list[TreeNode]:
        """The host-only nodes from below the deepest device node down to ``node``.

        ``TypeError``/``ValueError`` unless ``node`` is in the tree and backed up (or the root).
        """
        path = self.site.path_to_root(node)  # ``node`` first
        if path and node.host_slots is None:
            raise ValueError(f"init_load_back: node {node.id} is not backed up to the host")
        chain = []
        for n in path:
            if n.slots is None:
                chain.append(n)
        chain.reverse()
        return chain

    def load(self, chain: list[TreeNode]) -> torch.Tensor | None:
        """Queue the load of ``chain`` (host-only nodes, root side first; the caller has
        locked the last) into new device slots, agreed over the ranks, and hand each node its
        part: the slots (int64 ``[n]``, allocator's device), or None when a rank is short
        (nothing queued or changed)."""
        last, ctrl = chain[-1], self.controller
        parts = []
        for node in chain:  # host-only, so each has its host copy
            assert node.host_slots is not None, "a load of a node without a host copy"
            parts.append(node.host_slots)
        joined = parts[0].copy() if len(parts) == 1 else np.concatenate(parts)  # a new array
        host = torch.from_numpy(joined)  # int64: the tree's host slots
        device = self.tp.keep_if_all(
            ctrl.load(host, last.id, trusted=True),
            lambda _: ctrl.unqueue_load(last.id),
            where="load-back allocation",
        )
        if device is None:
            return None
        cpu, offset = host_copy(device).numpy(), 0  # the allocator's copy: no device read
        for node in chain:
            end = offset + len(node.key)
            self.site.give_device(node, cpu[offset:end].astype(np.int64))  # a private copy
            offset = end
        self._flight.loading[last.id] = last  # keeps the caller's lock until the ack
        above = chain[0].parent
        assert above is not None
        self._loads[last.id] = (last, above)
        self._load_backs += 1
        self._load_back_tokens += offset
        return device

    def cancel_load(self, last: TreeNode) -> None:
        """The load ending at ``last`` has landed (on every rank) and is not served: release
        its transfer lock now (its ack, popped later, finds no node)."""
        self._flight.cancel_load(last)
        del self._loads[last.id]
        self.site.unlock(last)

    def idle(self) -> bool:
        """Whether ``step`` has nothing to do: no write queued, no ack to pop (a load batch
        with layers left to issue keeps its ack until they are), nothing in flight, moving
        or shedding. A query; with nothing in flight ``step`` issues no collective either."""
        ctrl, flight = self.controller, self._flight
        busy = flight.writing or flight.loading or self._later or self._shedding
        return not (busy or ctrl.write_queue or ctrl.ack_write_queue or ctrl.ack_load_queue)
