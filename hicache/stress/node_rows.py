"""Per-node helpers of the stress tracker: a node's header, its copy on a tier as arrays, and
the oracle rows that copy must hold."""

from __future__ import annotations

from typing import Any

import numpy as np

from hicache.stress.shadow import pack
from hicache.stress.workload import SALTS


def header(node: Any) -> tuple[Any, ...]:
    """A node's state: its key, slots and host slots by identity (the arrays are kept alive in
    ``Tracker.alive``, so an id is never reused meanwhile), its parent and its lock count."""
    return id(node.key), id(node.slots), id(node.host_slots), node.parent, node.lock_ref


def slots_on(node: Any, tier: str) -> Any:
    return node.slots if tier == "device" else node.host_slots


def as_array(slots: Any) -> np.ndarray:
    """A node's stored slots (numpy, or a tensor on their device) as a CPU numpy array."""
    return slots if isinstance(slots, np.ndarray) else slots.cpu().numpy()


def offset_of(node: Any, root: Any) -> int:
    """Position of the node's first token in its sequence."""
    offset, node = 0, node.parent
    while node is not None and node is not root:
        offset, node = offset + len(node.key), node.parent
    return offset


def rows_of(node: Any, offset: int, tier: str) -> tuple[Any, ...]:
    """(tier, node, slots, tokens, positions, salts, packed) of the node's copy on ``tier``:
    int64 numpy columns, ``packed`` naming each row's content (see ``shadow.pack``)."""
    n, salt = len(node.key), SALTS[node.extra_key]
    tokens, positions = node.key.astype(np.int64), np.arange(offset, offset + n)
    return (
        tier,
        node,
        as_array(slots_on(node, tier)),
        tokens,
        positions,
        np.full(n, salt),
        pack(tokens, positions, salt),
    )
