"""HostComponents: a hybrid model's SWA KV and recurrent states beside each node's host copy.

The host KV pool of a hybrid model (``HybridKVPoolHost``) holds every attention layer of a
token in one host slot, so a node's host copy carries its SWA KV with its full KV; what the
tree must add is whether that SWA KV is valid, and the states, which live in their own host
pool (``MambaPoolHost``), one slot per node at most:

- **Backup.** When a node's host backup is queued, its host copy's SWA KV is flagged gone
  if the device copy was tombstoned (it then read the SWA pad slot), and its device state, if
  any, is copied to a host state slot; a state attached to a node already backed up is copied
  then (``backup_state``). State copies run on the current stream (``MambaPoolHost``), ordered
  before anything later on it: no host sync.
- **Device eviction.** A node that loses its device copy gives back its device state (the
  host copy keeps the host state) and its device tombstone.
- **Load-back.** Loaded nodes whose host SWA is gone are tombstoned on the device before the
  load is issued (their SWA writes land in the pad slot); the load's last node gets a device
  state slot and its host state copied in (``restore_state``).
- **Host state eviction.** Host states have their own LRU: when the host state pool is full,
  the least recently used one is freed (its node stays, usable only for full attention).
- **Deletion.** A node leaving the tree frees both its states.
- **Storage** (``tiers.storage.state_storage``): a host state is written to storage after its
  node's pages (``state_for_storage``; never evicted while ``busy``: a storage write reads
  it), and a state read from storage goes to a slot of ``alloc_host_state`` and then to the
  prefetched node (``adopt_state``), or back (``release_host_state``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

from hicache.devices import EventLike
from hicache.radix.component_ledger import ComponentLedger, HostComponentStats
from hicache.radix.components import MAMBA, NodeComponents, host_state_of, is_tombstoned, state_of
from hicache.radix.events import HOST, NodeEvents
from hicache.radix.node import TreeNode
from hicache.radix.page_hash import node_hashes
from hicache.tiers.host.state_sums import StateSums

_CPU = torch.device("cpu")


def _slot(value: int) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.int64)


class HostComponents:
    """The ``NodeWatch`` of a hybrid tree with a host tier; see the module docstring.

    Parameters
    ----------
    components : the device side's ``ComponentLedger`` (device states, tombstones).
    host_states : the ``MambaPoolHost`` of host states, or None (no linear layers).
    events : where KV events go, or None.
    sums : the host states' checksums (``StateSums``, verify on), or None.
    """

    def __init__(
        self,
        components: ComponentLedger,
        host_states: Any,
        events: NodeEvents | None,
        sums: StateSums | None = None,
    ) -> None:
        self.components, self.host_states, self.events = components, host_states, events
        self.sums = sums
        self.host_lru: dict[TreeNode, None] = {}  # nodes whose host copy holds a state
        self.states_backed_up = self.states_loaded = self.host_states_evicted = 0
        self.busy: Callable[[TreeNode], bool] = _never  # a storage write reads its host state
        self._copies: dict[int, EventLike] = {}  # host slot -> its backup copy's event

    def stats(self) -> HostComponentStats:
        capacity = 0 if self.host_states is None else self.host_states.size
        return HostComponentStats(
            len(self.host_lru),
            self.states_backed_up,
            self.states_loaded,
            self.host_states_evicted,
            capacity,
            state_integrity_failures=0 if self.sums is None else self.sums.failures,
        )

    # ---- NodeWatch -----------------------------------------------------------------------------

    def backed_up(self, node: TreeNode) -> None:
        """``node``'s host backup was queued: flag its host SWA, copy its state."""
        if node.comp is not None:
            node.comp.host_swa_gone = is_tombstoned(node.comp)
        self.backup_state(node)

    def device_dropped(self, node: TreeNode) -> None:
        """``node`` is host-only now: its device state and tombstone go."""
        comp = node.comp
        if comp is None:
            return
        if comp.swa_tombstoned:
            comp.swa_tombstoned = False
            self.components.swa_tombstoned_tokens -= len(node.key)
        self._drop_device_state(node)

    def deleted(self, node: TreeNode) -> None:
        """``node`` leaves the tree: both of its states are freed."""
        if node.slots is not None:
            self.device_dropped(node)
        self._free_host_state(node)

    # ---- states ------------------------------------------------------------------------------

    def backup_state(self, node: TreeNode) -> bool:
        """Copy ``node``'s device state to a new host state slot (evicting the least recently
        used host state when none is free) unless its host copy has one; whether it has one
        now. A no-op without a host copy or a device state."""
        comp, pool = node.comp, self.host_states
        if pool is None or node.host_slots is None or state_of(comp) is None:
            return host_state_of(comp) is not None
        assert comp is not None and comp.state is not None
        if comp.host_state is not None:
            return True
        host = self.alloc_host_state()
        if host is None:
            return False
        state = _slot(comp.state)
        self._copies[host] = pool.backup_from_device(self.components.state_pool, state, _slot(host))
        if self.sums is not None:  # verify on: wait for the copy, then take its checksum
            self._copies.pop(host).synchronize()
            self.sums.record(host)
        self.adopt_state(node, host)
        self.states_backed_up += 1
        return True

    def alloc_host_state(self) -> int | None:
        """A free host state slot (the least recently used state evicted when none is free),
        or None."""
        pool = self.host_states
        if not pool.available_size():
            self.evict_host_states(1)
        host = pool.alloc(1)
        return None if host is None else int(host[0])

    def release_host_state(self, slot: int) -> None:
        """Give back a slot of ``alloc_host_state`` that no node took."""
        self.host_states.free(_slot(slot))

    def adopt_state(self, node: TreeNode, slot: int) -> None:
        """``node``'s host copy (none of its own) holds the state in host slot ``slot`` now."""
        if node.comp is None:
            node.comp = NodeComponents()
        assert node.comp.host_state is None, "adopt_state: the node has a host state"
        node.comp.host_state = slot
        self.host_lru[node] = None
        if self.sums is not None and slot not in self._copies:  # a storage read filled it
            self.sums.record(slot)
        if self.events is not None:
            self.events.sink.publish(self.events.stored_events(node, HOST, MAMBA)[-1])

    def state_for_storage(self, node: TreeNode) -> int | None:
        """The host slot of ``node``'s host state, its backup copy completed (a sync on
        CUDA), for a storage write; None without one."""
        slot = host_state_of(node.comp)
        if slot is not None and slot in self._copies:
            self._copies.pop(slot).synchronize()
        return slot

    def restore_state(self, node: TreeNode) -> bool:
        """Give the device node ``node`` a device state copied from its host state (a free
        slot, or one freed by the device state LRU); whether it holds one now."""
        comp = node.comp
        if state_of(comp) is not None:
            return True
        if comp is None or comp.host_state is None or node.slots is None:
            return False
        if self.sums is not None and not self.sums.intact(comp.host_state):
            self._free_host_state(node)  # corrupt: never served
            return False
        device_pool = self.components.state_pool
        if not device_pool.available_size():
            self.components.evict_states(1)
        slot = device_pool.alloc(1)
        if slot is None:
            return False
        self.host_states.load_to_device(device_pool, _slot(comp.host_state), slot)
        self.touch(node)
        self.states_loaded += 1
        return self.components.put_state(node, int(slot[0].item()), True)

    def touch(self, node: TreeNode) -> None:
        """``node``'s host state was matched: the newest in the host LRU."""
        if node in self.host_lru:
            del self.host_lru[node]
            self.host_lru[node] = None

    def evict_host_states(self, num_states: int) -> int:
        """Free up to ``num_states`` host states, least recently used first."""
        idle = (node for node in self.host_lru if not self.busy(node))
        victims = list(itertools.islice(idle, num_states))
        for node in victims:
            self._free_host_state(node)
        self.host_states_evicted += len(victims)
        return len(victims)

    # ---- load-back ---------------------------------------------------------------------------

    def loaded(self, chain: list[TreeNode]) -> None:
        """The host-only ``chain`` got device slots (its load queued, not yet issued): a node
        whose host SWA is gone is tombstoned on the device before the load runs."""
        for node in chain:
            comp = node.comp
            if node.slots is not None and comp is not None and comp.host_swa_gone:
                self.components.tombstone(node)

    def clear(self) -> None:
        """Forget every host state (the host pools are being emptied)."""
        for node in self.host_lru:
            assert node.comp is not None
            node.comp.host_state = None
        self.host_lru.clear()
        self._copies.clear()
        if self.sums is not None:
            self.sums.clear()
        if self.host_states is not None:
            self.host_states.clear()

    # ---- internals ---------------------------------------------------------------------------

    def _drop_device_state(self, node: TreeNode) -> None:
        slot = self.components.drop_state(node)
        if slot is not None:
            self.components.states_evicted += 1
            self.components.release([slot])

    def _free_host_state(self, node: TreeNode) -> None:
        comp: NodeComponents | None = node.comp
        if comp is None or comp.host_state is None:
            return
        slot, comp.host_state = comp.host_state, None
        del self.host_lru[node]
        self._copies.pop(slot, None)
        if self.sums is not None:
            self.sums.forget(slot)
        self.host_states.free(_slot(slot))
        if self.events is not None:
            hashes = node_hashes(node, self.events.page_size)[-1:]
            self.events.removed_pages(hashes, HOST, MAMBA)


def _never(node: TreeNode) -> bool:
    return False
