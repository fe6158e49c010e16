"""HostTier: the host tier (L2) of a HiRadixCache, a ``tier.LowerTier`` over ``host_slots``.

It owns the host side's state: which nodes await a write or a load ack (each holding one
transfer lock, see ``tier``), the host-evictable leaves and the host size. It moves KV through
the ``HiCacheController`` and reaches the tree only through its ``tier.TierSite``. A backup
that finds the host pool short first evicts host-only leaves.

Tiering (``HiCacheConfig.tiering``): ``inclusive`` backs a node up only when its parent is the
root or backed up, so backed-up nodes stay root-connected, and a load-back keeps the host copy.
``exclusive`` backs up only the device leaf being evicted (move-on-evict, whatever the write
policy), so a host-only node may hang below a device node without a host copy, and sheds a
chain's host copies once its load has landed on every rank (``host_freeing``).

Under TP (``tp``) every rank runs the same calls on an identical tree, and each decision that
depends on this rank's own pools or transfers is agreed over the ranks: how many of a path's
backups got host slots (the fewest), whether a load got device slots (all or none), which
finished transfers are released (``InFlight``). Finished acks are then processed only by
``step`` (once per scheduler step), ``issue_loads`` and ``drain``, never by ``poll``.

Device slots a node gives up while its pending write still reads them (``hold``) stay out of
the allocator until that write has landed on every rank: the ledger's frees leave them
(``unheld``, a ``Ledger.keep``), the write's release frees them, and so does ``clear``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

from hicache.controller import HiCacheController
from hicache.devices import to_device
from hicache.radix.config import HiCacheConfig
from hicache.radix.events import NodeEvents
from hicache.radix.node import TreeNode
from hicache.radix.policies import LeafSet
from hicache.radix.slots import Slots
from hicache.radix.stats import HostStats
from hicache.radix.tier import BelowHost, TierSite
from hicache.tiers.host.host_backup import HostBackup
from hicache.tiers.host.host_freeing import HostFreeing
from hicache.tiers.host.host_loads import HostLoads
from hicache.tiers.host.in_flight import InFlight
from hicache.tp import TPGroup

T = TypeVar("T")
_NONE = torch.empty(0, dtype=torch.int64)


class HostTier(HostFreeing, HostLoads, HostBackup):
    """Host copies of tree nodes (``TreeNode.host_slots``) in ``controller.mem_pool_host``.

    Parameters
    ----------
    site : the tree and device accounting (a ``Ledger``).
    controller : moves KV between the device and the host pool.
    policy : the cache's eviction policy (orders ``leaves``).
    config : the host-tier settings (write policy, tiering).
    events : where the host tier's KV events go, or None (events off). A node's host pages are
        reported stored when its backup is queued (its host slots are reserved and ``holds`` is
        true from then on), removed when they are freed.
    tp : the TP group whose ranks agree on this tier's decisions (one rank: no collectives).
    """

    def __init__(
        self,
        site: TierSite,
        controller: HiCacheController,
        policy: str,
        config: HiCacheConfig,
        events: NodeEvents | None = None,
        tp: TPGroup | None = None,
    ) -> None:
        self.site, self.controller, self.config = site, controller, config
        self.exclusive = config.tiering == "exclusive"
        self._backup_hits = config.backup_hits  # the config is frozen
        self.events, self.tp = events, TPGroup() if tp is None else tp
        self._solo = not self.tp.active  # one rank (or agreement off): nothing to agree
        self.leaves = LeafSet(policy)
        self._size = 0
        self._flight = InFlight(self.tp)  # nodes locked until their write or load ack
        ids = getattr(controller.token_to_kv_pool_allocator, "slot_ids", None)  # ``SlotIds``
        self._slots_on_device = ids.on_device if ids is not None else self._uploaded
        self._backup_tokens = self._load_backs = self._load_back_tokens = self._evicted_tokens = 0
        self._reserved = 0  # host slots handed out by ``reserve`` and not yet adopted/released
        self._shedding: dict[int, TreeNode] = {}
        self._loads: dict[int, tuple[TreeNode, TreeNode]] = {}
        self._later: dict[int, TreeNode] = {}
        self.below: BelowHost | None = None

    def _uploaded(self, slots: torch.Tensor) -> torch.Tensor:
        return to_device(slots, self.controller.device)

    def attach(self, below: BelowHost) -> None:
        """Put a storage tier below this one (before the first node is added)."""
        self.below = below

    # ---- queries -----------------------------------------------------------------------------

    def holds(self, node: TreeNode) -> bool:
        return node.host_slots is not None

    def is_evictable_leaf(self, node: TreeNode) -> bool:
        """Unlocked, host-only and childless: what ``evict`` may delete."""
        if node.lock_ref or node.slots is not None or node.host_slots is None or node.children:
            return False
        return self.below is None or not self.below.pins(node)

    def hangs_below(self, node: TreeNode) -> bool:
        """Whether a host-only node may hang below the tree node ``node``: one with a host
        copy under inclusive tiering, any under exclusive."""
        return self.exclusive or node.host_slots is not None

    def refile(self, node: TreeNode) -> None:
        if node.slots is not None or node.lock_ref:  # never a host-evictable leaf
            if node.id in self.leaves.members:
                self.leaves.discard(node)
        else:
            self.leaves.put(node, self.is_evictable_leaf(node))

    def size(self) -> int:
        return self._size

    def pending(self) -> dict[str, list[TreeNode]]:
        """The nodes awaiting a ``"write"`` and a ``"load"`` ack (each holds a transfer lock)."""
        return self._flight.pending()

    def writing(self) -> list[TreeNode]:
        """The nodes whose host copy a pending write fills: those awaiting a write ack and the
        nodes a split has put above them since (the write reads their device slots)."""
        return self._flight.written()

    def stats(self) -> HostStats:
        return HostStats(
            backup_tokens=self._backup_tokens,
            load_backs=self._load_backs,
            load_back_tokens=self._load_back_tokens,
            evicted_tokens=self._evicted_tokens,
            size_tokens=self._size,
            capacity_tokens=self.controller.mem_pool_host.size,
            pending_writes=len(self._flight.writing),
            pending_loads=len(self._flight.loading),
            tiering=self.config.tiering,
        )

    def transfer_locks(self) -> Counter[int]:
        return Counter(n.id for nodes in self._flight.pending().values() for n in nodes)

    # ---- device slots a pending write reads -------------------------------------------------

    def hold(self, node: TreeNode, slots: Slots) -> bool:
        """Keep the device ``slots`` that ``node`` gives up (no node's from now on) out of the
        allocator while a pending write reads them (``writing``): freed once it has landed on
        every rank. False, nothing kept, when no pending write reads ``node``'s slots."""
        writer = self._flight.writer_of(node)
        if writer is None:
            return False
        self._flight.held.setdefault(writer.id, []).append(slots)
        return True

    def held(self) -> torch.Tensor:
        """The device slots ``hold`` keeps now (CPU int64 ``[n]``, empty when none): allocated
        but neither a node's nor a request's until their write lands (an ownership count
        adds them to the owned slots)."""
        groups = [s for group in self._flight.held.values() for s in group]
        return torch.from_numpy(np.concatenate(groups)) if groups else _NONE

    def unheld(self, slots: torch.Tensor) -> torch.Tensor:
        """``slots`` (CPU int64, being freed) less those ``hold`` keeps: ``Ledger.keep``."""
        if not self._flight.held:
            return slots
        return slots[~torch.isin(slots, self.held())]

    # ---- transfers ---------------------------------------------------------------------------

    def poll(self) -> None:
        """Issue queued writes and process finished acks; under TP a no-op (``step`` does it)."""
        if self._solo:  # ``step``'s body
            self._settle(self.controller.start_writing, "check_hicache_events")

    def step(self) -> None:
        """Issue queued writes, process the transfers every rank has finished (no wait)."""
        self._settle(self.controller.start_writing, "check_hicache_events")

    def issue_loads(self) -> int:
        """Issue the queued loads; the producer index (-1: none), then pop finished acks.
        Nothing queued on an idle tier (a decode step's call): -1 at once, as the settle."""
        if not self.controller.load_queue and self.idle():
            return -1
        producer = self._settle(self.controller.start_loading, "ready_to_load_host_cache")
        assert producer is not None
        return producer

    def drain(self) -> None:
        self._settle(self.controller.drain, "drain")

    def _settle(self, issue: Callable[[], T], where: str) -> T | None:
        """Run ``issue``, then unlock the nodes whose transfers every rank has finished (under
        exclusive tiering, a landed load's chain sheds its host copies)."""
        result, written, loaded = self._flight.settle(self.controller, issue, where)
        for node in (*written, *loaded):
            self.site.unlock(node)
        if self._flight.held:  # slots only the landed writes still read
            self.site.free(self._flight.unhold(written))
        if self._later:  # moves left to finish when their writes land
            self.finish_moves(written)
        for node in loaded:
            last, above = self._loads.pop(node.id)
            if self.exclusive:  # shedding is a no-op under inclusive tiering
                self.shed(self.load_chain(last, above))
        if self._shedding:
            self.retry_shedding()
        if self.below is not None:
            for node in written:
                self.below.backed_up(node)
        return result

    def clear(self) -> None:
        """Wait for transfers in flight and drop them (freeing the device slots only they
        read), then empty the host pool."""
        self.controller.reset()
        held = self._flight.unhold(list(self._flight.writing.values()))
        self._flight.clear()
        self.site.free(held)
        self._shedding.clear()
        self._loads.clear()
        self._later.clear()
        self.controller.mem_pool_host.clear()
        self.leaves.clear()
        self._size = 0
