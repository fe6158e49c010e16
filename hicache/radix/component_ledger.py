"""ComponentLedger: the SWA and recurrent-state accounting of a hybrid model's tree.

The ``Ledger`` keeps full-attention KV; this keeps the other two components of
``components.NodeComponents``: the states (one ``MambaPool`` slot each, in their own LRU,
evicted under the state pool's pressure) and the SWA tombstones (a node whose SWA KV was
freed because no live window needs it). A *live window* is the last ``W`` tokens before a
node some request locked itself (``own_lock_ref``): a node with a token in one is never
tombstoned. Tombstoning a node also frees every state whose window it breaks, so the tree
never holds a state no match can use (``hybrid_match.window_intact``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from hicache.radix.components import MAMBA, SWA, HybridConfig, NodeComponents, is_tombstoned
from hicache.radix.events import DEVICE, NodeEvents
from hicache.radix.node import TreeNode
from hicache.radix.page_hash import node_hashes
from hicache.radix.slots import as_tensor
from hicache.radix.stats import CacheStats


@dataclass(frozen=True)
class ComponentStats:
    """Recurrent states and SWA tombstones of a hybrid cache (``HybridRadixCache.stats``).

    states_held : nodes holding a state now (gauge); states_stored, states_evicted : states
        the tree took and gave back (counters; an unusable state given back at once counts
        in neither). state_hits : matches whose usable prefix ends at a state (counter).
    swa_tombstoned_tokens : tokens whose SWA KV is freed now (gauge);
        swa_tombstoned_total : tokens ever tombstoned (counter).
    """

    states_held: int
    states_stored: int
    states_evicted: int
    swa_tombstoned_tokens: int
    swa_tombstoned_total: int
    state_hits: int = 0


@dataclass(frozen=True)
class HostComponentStats:
    """Recurrent states on the host tier (``HybridCacheStats.host_components``).

    host_states_held : nodes whose host copy holds a state now (gauge); states_backed_up,
    states_loaded, host_states_evicted : states copied to the host, copied back to the device,
    and freed from the host by its LRU (counters). host_state_capacity : host state slots.
    state_integrity_failures : host states found corrupt before a load-back (``verify``).
    states_stored, states_fetched : states written to the storage tier and read back from it
    into the host (counters; 0 without a storage tier).
    """

    host_states_held: int
    states_backed_up: int
    states_loaded: int
    host_states_evicted: int
    host_state_capacity: int
    states_stored: int = 0
    states_fetched: int = 0
    state_integrity_failures: int = 0


@dataclass(frozen=True)
class HybridCacheStats(CacheStats):
    """``CacheStats`` of a ``HybridRadixCache``, with its ``ComponentStats`` (and, with a host
    tier, its ``HostComponentStats``)."""

    components: ComponentStats | None = None
    host_components: HostComponentStats | None = None


class ComponentLedger:
    """SWA and state accounting over one tree; states go back to ``state_pool`` (an object with
    ``free(int64 tensor)``, a ``MambaPool``) and SWA slots to ``allocator.free_swa`` (when the
    allocator has one)."""

    def __init__(
        self, config: HybridConfig, state_pool: Any, allocator: Any, events: NodeEvents | None
    ) -> None:
        self.config, self.state_pool, self.events = config, state_pool, events
        self._free_swa = getattr(allocator, "free_swa", None)
        self.state_lru: dict[TreeNode, None] = {}  # nodes holding a state, oldest use first
        self.states_stored = self.states_evicted = self.state_hits = 0
        self.swa_tombstoned_tokens = self.swa_tombstoned_total = 0

    def stats(self) -> ComponentStats:
        return ComponentStats(
            len(self.state_lru),
            self.states_stored,
            self.states_evicted,
            self.swa_tombstoned_tokens,
            self.swa_tombstoned_total,
            self.state_hits,
        )

    # ---- states ------------------------------------------------------------------------------

    def put_state(self, node: TreeNode, slot: int, window_ok: bool) -> bool:
        """Give ``node`` the state ``slot`` (the tree owns it from now on); returns whether it
        was kept. It is freed instead when ``node`` has one already or ``window_ok`` is False
        (its window is broken: no match could use it)."""
        if node.comp is not None and node.comp.state is not None or not window_ok:
            self.release([slot])
            return False
        if node.comp is None:
            node.comp = NodeComponents()
        node.comp.state = slot
        self.state_lru[node] = None
        self.states_stored += 1
        if self.events is not None:
            self.events.sink.publish(self.events.stored_events(node, DEVICE, MAMBA)[-1])
        return True

    def touch(self, node: TreeNode) -> None:
        """``node``'s state was matched: the newest in the LRU."""
        if node in self.state_lru:
            self.state_hits += 1
            del self.state_lru[node]
            self.state_lru[node] = None

    def drop_state(self, node: TreeNode) -> int | None:
        """Take ``node``'s state off it (not freed); returns its slot, or None."""
        comp = node.comp
        if comp is None or comp.state is None:
            return None
        slot, comp.state = comp.state, None
        del self.state_lru[node]
        if self.events is not None:
            self.events.removed_pages(node_hashes(node, self.events.page_size)[-1:], DEVICE, MAMBA)
        return slot

    def evict_states(self, num_states: int) -> int:
        """Free up to ``num_states`` states, least recently used first, skipping nodes a
        request locked itself; returns how many were freed."""
        victims = [n for n in self.state_lru if not n.own_lock_ref][:num_states]
        self.release([self.drop_state(n) for n in victims])
        self.states_evicted += len(victims)
        return len(victims)

    def release(self, slots: list[int | None]) -> None:
        kept = [s for s in slots if s is not None]
        if kept:
            self.state_pool.free(torch.tensor(kept, dtype=torch.int64))

    # ---- SWA tombstones ----------------------------------------------------------------------

    def in_live_window(self, node: TreeNode) -> bool:
        """Whether a token of ``node`` is among the last ``W`` before a node a request locked
        itself (``node`` or one below it)."""
        window = self.config.sliding_window
        assert window is not None
        if node.own_lock_ref:
            return True
        stack = [(child, len(child.key)) for child in node.children.values() if child.lock_ref]
        while stack:
            child, depth = stack.pop()  # depth: tokens from node's end to child's end
            if child.own_lock_ref and depth < window:
                return True
            if depth < window:
                stack.extend((c, depth + len(c.key)) for c in child.children.values() if c.lock_ref)
        return False

    def tombstone(self, node: TreeNode) -> int:
        """Free ``node``'s SWA KV (it stays for its full KV) and every state whose window
        this breaks; returns the SWA tokens freed."""
        assert node.slots is not None and not is_tombstoned(node.comp)
        if self._free_swa is not None:
            self._free_swa(as_tensor(node.slots))
        if node.comp is None:
            node.comp = NodeComponents()
        node.comp.swa_tombstoned = True
        self.swa_tombstoned_tokens += len(node.key)
        self.swa_tombstoned_total += len(node.key)
        if self.events is not None:
            self.events.removed(node, DEVICE, SWA)
        broken = [self.drop_state(n) for n in self._within_window(node)]
        self.states_evicted += sum(s is not None for s in broken)
        self.release(broken)
        return len(node.key)

    def revive(self, node: TreeNode) -> None:
        """``node`` was given new slots whose SWA KV is live: no longer a tombstone."""
        assert node.comp is not None and node.comp.swa_tombstoned
        node.comp.swa_tombstoned = False
        self.swa_tombstoned_tokens -= len(node.key)
        if self.events is not None:
            self.events.stored(node, DEVICE, SWA)

    def evict_swa(self, num_tokens: int, nodes: Iterator[TreeNode]) -> int:
        """Tombstone nodes of ``nodes`` outside every live window, least recently used first,
        until ``num_tokens`` SWA tokens are freed (or none is left); returns the tokens freed."""
        live = [n for n in nodes if n.slots is not None and not is_tombstoned(n.comp)]
        live.sort(key=lambda n: (n.last_access_time, n.id))
        freed = 0
        for node in live:
            if freed >= num_tokens:
                break
            if not self.in_live_window(node):
                freed += self.tombstone(node)
        return freed

    def forget(self, node: TreeNode) -> int | None:
        """``node`` leaves the tree (its full KV was evicted): returns its state slot (not
        freed) and drops its tombstone from the gauge."""
        if is_tombstoned(node.comp):
            self.swa_tombstoned_tokens -= len(node.key)
        return self.drop_state(node)

    def clear(self) -> list[int | None]:
        """Forget every node; returns the state slots held (not freed)."""
        slots = [n.comp.state for n in self.state_lru if n.comp is not None]
        self.state_lru.clear()
        self.swa_tombstoned_tokens = 0
        return list(slots)

    def _within_window(self, node: TreeNode) -> list[TreeNode]:
        """``node`` and the nodes below it whose last ``W`` tokens include one of ``node``'s."""
        window = self.config.sliding_window
        assert window is not None
        found, stack = [node], [(c, len(c.key)) for c in node.children.values()]
        while stack:
            child, depth = stack.pop()
            if depth < window:
                found.append(child)
                stack.extend((c, depth + len(c.key)) for c in child.children.values())
        return found
