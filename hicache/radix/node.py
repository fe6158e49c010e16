"""TreeNode: one edge of the radix tree — a run of whole pages and the slots that hold their KV."""

from __future__ import annotations

import itertools
from collections.abc import Hashable

import numpy as np
import torch

from hicache.radix.components import NodeComponents
from hicache.radix.slots import Slots, as_tensor, stored_form
from hicache.radix.tokens import TOKEN_DTYPE

_NODE_IDS = itertools.count()  # every TreeNode's id, unique in the process

_EMPTY_KEY = np.empty(0, TOKEN_DTYPE)
_EMPTY_KEY.flags.writeable = False
ChildKey = Hashable  # first page's bytes; ``(extra_key, bytes)`` under the root


class TreeNode:
    """A node of the radix tree; the root has an empty key and no parent.

    Attributes
    ----------
    key : int32 numpy ``[n]`` (CPU, read-only), ``n`` a positive multiple of ``page_size`` — the
        token ids on the edge from ``parent`` to this node (may view a RadixKey's buffer).
    value : int64 tensor ``[n]`` of device KV slots (on their device), or None once the device
        copy is evicted (host-only node of the hierarchical cache). A property over ``slots``:
        CPU slots come back as a zero-copy ``torch.from_numpy`` view; read it, never write it.
    host_value : int64 tensor ``[n]`` of host KV slots (CPU), or None when not backed up; a
        property over ``host_slots`` like ``value``.
    slots, host_slots : the same slots in the stored form of ``slots.Slots`` (numpy int64 for
        CPU slots, else a tensor on their device); what the tree's own code uses.
    extra_key : namespace shared by the whole root-to-node path.
    child_key : the key of this node in ``parent.children`` (None until linked).
    lock_ref : locks held on this node or a descendant; locked nodes are never evicted.
    own_lock_ref : locks taken on this node itself (``inc_lock_ref(node)`` calls not yet undone);
        ``lock_ref == own_lock_ref + sum(child.lock_ref)`` below the root.
    hit_count : matches and inserts that reached this node after it was created.
    last_access_time, creation_time : ticks of the owning cache's logical clock (larger is newer).
    priority : max priority of the inserts that reached it; the ``priority`` policy evicts the
        lowest first.
    hash_value : the page hashes of ``key`` (``page_hash``: one 32-byte digest per page, chained
        from the root through the namespace seed), or None until first needed
        (``page_hash.node_hashes``); ``RadixTree.split`` divides them, never recomputes.
    comp : the node's other components (``components.NodeComponents``: SWA tombstone, recurrent
        state slot) in a hybrid model's cache; None (the only value in a plain cache) means
        SWA KV present and no state.
    id : unique in the process (the leaf sets key on it and break eviction ties by it), so,
        unlike SGLang's ``TreeNode.counter``, the counter can be neither reset nor overridden.

    ``TreeNode()`` (all defaults) is a detached node with an empty key and no slots.
    """

    __slots__ = (
        "id",
        "parent",
        "children",
        "key",
        "slots",
        "host_slots",
        "extra_key",
        "child_key",
        "lock_ref",
        "own_lock_ref",
        "hit_count",
        "last_access_time",
        "creation_time",
        "priority",
        "hash_value",
        "comp",
    )

    def __init__(
        self,
        key: np.ndarray | None = None,
        slots: Slots | None = None,
        parent: TreeNode | None = None,
        extra_key: Hashable | None = None,
        tick: int = 0,
        priority: int = 0,
    ) -> None:
        self.id = next(_NODE_IDS)
        self.parent = parent
        self.children: dict[ChildKey, TreeNode] = {}
        self.key = _EMPTY_KEY if key is None else key
        self.slots = slots  # stored form (see ``slots.Slots``), unchecked: the insert path
        self.host_slots: Slots | None = None
        self.extra_key = extra_key
        self.child_key: ChildKey | None = None
        self.lock_ref = 0
        self.own_lock_ref = 0
        self.hit_count = 0
        self.last_access_time = tick
        self.creation_time = tick
        self.priority = priority
        self.hash_value: list[bytes] | None = None
        self.comp: NodeComponents | None = None

    @property
    def value(self) -> torch.Tensor | None:
        """The device slots as an int64 tensor ``[n]`` sharing the node's memory, or None."""
        return None if self.slots is None else as_tensor(self.slots)

    @value.setter
    def value(self, value: torch.Tensor | np.ndarray | None) -> None:
        """Store ``value`` without copying it (a CPU tensor as its numpy view): the tree owns
        what is assigned, so the caller must not write it or free its slots afterwards."""
        self.slots = stored_form(value)

    @property
    def host_value(self) -> torch.Tensor | None:
        """The host slots as an int64 tensor ``[n]`` sharing the node's memory, or None."""
        return None if self.host_slots is None else as_tensor(self.host_slots)

    @host_value.setter
    def host_value(self, value: torch.Tensor | np.ndarray | None) -> None:
        """As the ``value`` setter: stored without a copy, owned by the tree from then on."""
        self.host_slots = stored_form(value)

    @property
    def evicted(self) -> bool:
        """The device copy is gone (``value is None``)."""
        return self.slots is None

    @property
    def backuped(self) -> bool:
        """A host copy exists (``host_value is not None``)."""
        return self.host_slots is not None

    def get_last_hash_value(self) -> bytes | None:
        """The hash of the node's last page, or None before its hashes are computed."""
        return None if self.hash_value is None else self.hash_value[-1]

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.id}, len={len(self.key)}, lock_ref={self.lock_ref}, "
            f"evicted={self.evicted}, backuped={self.backuped})"
        )
