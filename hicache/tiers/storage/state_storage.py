"""StateStorage: a hybrid model's recurrent states in the storage tier, beside its KV pages.

A state is one object (``backends.composite_pages.StatePageIO``: the host state slot's bytes),
keyed by the key of the page that ends the node holding it, in a namespace of its own: a second
backend instance over the same ``StorageConfig`` whose fingerprint (``hybrid_fingerprint``)
names the state shapes, so it never meets a page key.

- **Write** (the backup thread): when a node whose host copy holds a state has its pages
  written, the state follows them on the same thread (``StorageBackups``), only if every page
  was written; a state the node gains after its pages were queued is written by a backup of
  no pages queued after them. The node is pinned meanwhile, and ``HostComponents.busy`` keeps
  the host state from its LRU.
- **Read** (the scheduler thread, when a prefetch ends): of the pages read, the longest prefix
  ending at a page whose state storage has is kept (``fetch``: existence asked page by page
  from the last, then the state read into a host state slot); pages past it are not adopted
  (a recurrent model cannot resume there). Under TP the ranks agree on that page (the
  fewest) and on the read's success (all, else the next page down is tried).

Calls go through a ``GuardedStorage``: bounded, errors are misses.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from hicache.backends import StorageKeys
from hicache.backends.guard import GuardedStorage
from hicache.radix.components import MAMBA
from hicache.radix.events import BlockStored, Medium, NodeEvents
from hicache.radix.node import TreeNode
from hicache.radix.page_hash import node_hashes
from hicache.tiers.host.host_components import HostComponents
from hicache.tp import TPGroup


class StateWrite(NamedTuple):
    """A state to write: its object key, host state slot, and KV event (None: events off)."""

    key: str
    slot: int
    event: BlockStored | None


class StateStorage:
    """Recurrent states through ``storage`` (its own namespace, ``keys``); see the module
    docstring.

    Parameters
    ----------
    storage : the guarded state backend (a ``MambaPoolHost`` registered).
    keys : the state keys (page size 1, the state fingerprint).
    components : the cache's ``HostComponents`` (host state slots).
    tp : the cache's TP group.
    page_size : tokens per KV page.
    events, medium : where the state's ``BlockStored`` (component ``mamba``) goes (None: off).

    Attributes
    ----------
    written, read : states written to / read from storage (counters).
    """

    def __init__(
        self,
        storage: GuardedStorage,
        keys: StorageKeys,
        components: HostComponents,
        tp: TPGroup,
        page_size: int,
        events: NodeEvents | None = None,
        medium: Medium = "DISK",
    ) -> None:
        self.storage, self.keys, self.components, self.tp = storage, keys, components, tp
        self.page_size, self.events, self.medium = page_size, events, medium
        self.written = self.read = 0

    def key(self, page_hash: bytes) -> str:
        """The state key of the page ``page_hash`` (the page ending the node)."""
        return self.keys.page_keys([page_hash])[0]

    # ---- writes ------------------------------------------------------------------------------

    def pending_write(self, node: TreeNode) -> StateWrite | None:
        """The write of ``node``'s host state (scheduler thread, when its backup is queued),
        or None without one."""
        slot = self.components.state_for_storage(node)
        if slot is None:
            return None
        stored = None if self.events is None else self._event(node)
        return StateWrite(self.key(node_hashes(node, self.page_size)[-1]), slot, stored)

    def _event(self, node: TreeNode) -> BlockStored:
        assert self.events is not None
        return self.events.stored_events(node, self.medium, MAMBA)[-1]

    def write(self, job: StateWrite) -> None:
        """Write ``job``'s state (backup thread); a failure is a miss."""
        done = self.storage.batch_set_v1([job.key], _slot(job.slot))
        if done and done[0]:
            self.written += 1
            if self.events is not None and job.event is not None:
                self.events.sink.publish(job.event)

    # ---- reads -------------------------------------------------------------------------------

    def fetch(self, hashes: list[bytes], pages: int) -> tuple[int, int | None]:
        """Of the first ``pages`` of the pages ``hashes``, the most ending at a page whose
        state was read into a new host state slot: ``(pages, slot)``, or ``(0, None)``.
        Agreed over TP (every rank calls it with the same ``pages``)."""
        while pages > 0:
            (pages,), _ = self.tp.agree([self._last_state(hashes, pages)], where="storage states")
            if not pages:
                break
            slot = self._read(hashes[pages - 1])
            (ok,), _ = self.tp.agree([int(slot is not None)], where="storage state read")
            if ok and slot is not None:
                return pages, slot
            if slot is not None:
                self.components.release_host_state(slot)
            pages -= 1
        return 0, None

    def _last_state(self, hashes: list[bytes], pages: int) -> int:
        """The last of the first ``pages`` pages whose state storage has (1-based), or 0."""
        for end in range(pages, 0, -1):
            if self.storage.batch_exists([self.key(hashes[end - 1])]):
                return end
        return 0

    def _read(self, page_hash: bytes) -> int | None:
        """The state of page ``page_hash`` in a new host state slot, or None."""
        slot = self.components.alloc_host_state()
        if slot is None:
            return None
        done = self.storage.batch_get_v1([self.key(page_hash)], _slot(slot))
        if done and done[0]:
            self.read += 1
            return slot
        self.components.release_host_state(slot)
        return None

    def place(self, node: TreeNode | None, slot: int) -> None:
        """The state ``fetch`` read into host slot ``slot`` goes to ``node`` (the prefetched
        host-only leaf ending at its page), or back to the pool (None: nothing was adopted)."""
        if node is None:
            self.components.release_host_state(slot)
        else:
            self.components.adopt_state(node, slot)

    def close(self) -> None:
        self.storage.close()


def _slot(slot: int) -> torch.Tensor:
    return torch.tensor([slot], dtype=torch.int64)
