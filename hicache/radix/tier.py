"""The tier contract: what a tier below the device holds per node and how the cache drives it.

The device tier (L1) is the tree's own: ``TreeNode.slots``, accounted by ``Ledger``. A lower
tier — the host tier (L2, ``HostTier``: ``TreeNode.host_slots``) today, a storage tier (L3: a
per-node page hash / storage key) next — keeps a second copy of some nodes and implements
:class:`LowerTier`. It reaches the tree and the device accounting only through
:class:`TierSite` (``Ledger`` implements it), never through another object's private state.

Rules every lower tier keeps:

- **Prefix order.** A node gets a copy only when its parent (below the root) has one, so the
  nodes a tier holds form a root-connected subtree; backups run parents first.
- **Transfer locks.** A node whose copy is being written, or the last node of a chain being
  loaded, holds one lock (``TierSite.lock``) from the moment the transfer is queued until its
  completion is processed; the lock covers its ancestors, so no transfer ever reads or writes
  slots that were freed and reused. ``transfer_locks`` reports them.
- **Leaves.** ``leaves`` orders, by the cache's eviction policy, exactly the nodes this tier may
  free on its own: unlocked, held only here (no copy in a tier above), with no child. Their
  sort keys read the node's policy fields, so ``Ledger`` discards and re-adds them around a
  hit, and discards a node when it becomes locked; ``refile`` re-decides membership after
  anything else changed.
- **Device eviction.** A device leaf this tier ``holds`` loses only its device copy and stays
  in the tree; any other device leaf is deleted.

The cache's own calls about the tiers below it (SGLang's ``init_load_back``,
``prefetch_from_storage``, ...) go down a chain of link objects, :class:`TierChain`: the host
link answers the host calls and forwards the storage calls to the storage link below it, and
``NoLowerTier`` stands in for a missing tier.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from hicache.radix.node import TreeNode
from hicache.radix.policies import LeafSet
from hicache.radix.slots import Slots


class NodeWatch(Protocol):
    """Told by the ``Ledger`` and the host tier when a node gains or loses a copy: what keeps
    a hybrid model's other components (states, SWA tombstones) beside each copy of a node."""

    def device_dropped(self, node: TreeNode) -> None:
        """``node`` lost its device copy and stays in the tree (a lower tier holds it)."""

    def deleted(self, node: TreeNode) -> None:
        """``node``, a leaf, is leaving the tree (its slots already freed or being freed)."""

    def backed_up(self, node: TreeNode) -> None:
        """``node``'s host backup was just queued (told by the host tier)."""


class TierSite(Protocol):
    """What a tier may do to the tree and the device accounting; ``watch`` is told of copies
    gained and lost (None: a plain model's tree)."""

    watch: NodeWatch | None

    def nodes(self) -> Iterator[TreeNode]:
        """Every node below the root, parents first."""

    def path_to_root(self, node: TreeNode) -> list[TreeNode]:
        """``node`` and its ancestors below the root, deepest first (``ValueError``: not in
        the tree)."""

    def lock(self, node: TreeNode) -> int:
        """One lock on ``node`` and its ancestors (host-only nodes included)."""

    def unlock(self, node: TreeNode) -> int:
        """Undo one ``lock`` on ``node``."""

    def give_device(self, node: TreeNode, slots: Slots) -> None:
        """``node`` (without a device copy) now holds device ``slots`` (int64 ``[len(key)]``)."""

    def drop_device(self, node: TreeNode) -> None:
        """Free ``node``'s device copy; the node stays in the tree."""

    def free(self, slots: list[Slots]) -> None:
        """Give device ``slots`` that no node holds back to the allocator."""

    def delete_leaf(self, node: TreeNode) -> None:
        """Remove the leaf ``node`` (its copies already freed) from the tree."""

    def add_host_leaf(self, leaf: TreeNode, child_key: object) -> None:
        """Link the new leaf ``leaf``, which has no device copy, under its parent."""


class LowerTier(Protocol):
    """A tier below the device. ``leaves`` and ``holds``/``refile`` are called on every
    re-filing and must stay O(1); the rest runs on transfers and checks."""

    leaves: LeafSet
    """The nodes this tier may free on its own (see the module docstring)."""

    def holds(self, node: TreeNode) -> bool:
        """Whether this tier has (or is writing) a copy of ``node``."""

    def refile(self, node: TreeNode) -> None:
        """Put ``node`` in or out of ``leaves`` after its state changed."""

    def size(self) -> int:
        """Tokens with a copy in this tier (writes in flight included)."""

    def backup_path(self, last: TreeNode) -> None:
        """Queue copies of the nodes from the root to ``last`` that the tier's write policy
        asks for, parents first; a no-op for nodes it already holds."""

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` of this tier's tokens by deleting ``leaves`` in order;
        returns the tokens freed (fewer only when ``leaves`` ran out)."""

    def load(self, chain: list[TreeNode]) -> torch.Tensor | None:
        """Queue the load of ``chain`` (root side first, each node held here and not above) into
        the tier above; the caller holds one lock on ``chain[-1]``, which this tier keeps as the
        transfer lock on success. Returns the destination slots, or None (nothing changed)."""

    def poll(self) -> None:
        """Issue queued transfers; process the finished ones (never blocks)."""

    def drain(self) -> None:
        """Issue queued writes; block until every issued transfer has landed; process them."""

    def transfer_locks(self) -> Counter[int]:
        """Node id -> locks this tier holds on that node itself for pending transfers."""

    def clear(self) -> None:
        """Forget every copy and pending transfer (the caller has waited for them)."""


class BelowHost(Protocol):
    """What the host tier asks of a storage tier attached below it (``HostTier.attach``): a
    storage tier keeps pages by hash, not nodes, so it is not a ``LowerTier`` of the tree."""

    def pins(self, node: TreeNode) -> bool:
        """Whether ``node``'s host copy is being written to storage (not evictable)."""

    def reading(self, slots: Slots) -> bool:
        """Whether a storage write in flight reads any of the host ``slots`` (a node may have
        split since its write was queued; the host tier frees none of them meanwhile)."""

    def backed_up(self, node: TreeNode) -> None:
        """``node``'s host write landed: queue what storage needs of its path."""

    def settle(self) -> None:
        """Block until no storage write reads host slots."""

    def victims(self, leaves: LeafSet) -> Iterator[TreeNode]:
        """The host-evictable ``leaves`` the host tier may delete now, popped in policy order
        as it asks for them (the storage tiering may write some first, and block on it)."""


class StorageChain(Protocol):
    """The cache calls a storage link answers (``BasePrefixCache`` holds their contract): the
    last link of ``TierChain``, a ``StorageLink`` or, without storage, ``NoLowerTier``."""

    def prefetch_from_storage(
        self, req_id: str, last_host_node: TreeNode, new_input_tokens: Any
    ) -> bool: ...
    def check_prefetch_progress(self, req_id: str) -> bool: ...
    def pop_prefetch_loaded_tokens(self, req_id: str) -> int: ...
    def release_aborted_request(self, req_id: str) -> None: ...
    def note_prefill(self, tokens: int, seconds: float) -> None: ...
    def check_hicache_events(self) -> None: ...
    def drain_transfers(self) -> None: ...


class TierChain(StorageChain, Protocol):
    """The chain of tiers below the device (``BasePrefixCache.tiers``): every call of the cache
    about a lower tier goes to its first link, which answers its own and forwards the rest.
    ``NoLowerTier`` (device only), or a ``HostLink`` over a ``StorageLink`` / ``NoLowerTier``."""

    def init_load_back(
        self, last_host_node: TreeNode, host_hit_length: int, mem_quota: int | None
    ) -> tuple[torch.Tensor, TreeNode]: ...
    def ready_to_load_host_cache(self) -> int: ...
    def consume_load_batch(self, index: int) -> None: ...
    def host_size(self) -> int: ...
    def evict_host(self, num_tokens: int) -> int: ...


# The chain's calls that change state (every one but ``host_size``), space-separated.
TIER_CHANGES = (
    "init_load_back ready_to_load_host_cache consume_load_batch evict_host check_hicache_events "
    "drain_transfers prefetch_from_storage check_prefetch_progress pop_prefetch_loaded_tokens "
    "release_aborted_request note_prefill"
)
