"""Per-node helpers of the stress tracker: a node's header, its copy on a tier as arrays, the
oracle rows that copy must hold, and its structure's checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hicache.stress.shadow import pack
from hicache.stress.workload import SALTS

TIERS = ("device", "host")
_INT64 = (np.dtype(np.int64), torch.int64)


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


def structure(node: Any, root: Any, page_size: int, inclusive: bool) -> list[str]:
    """What is wrong with ``node``'s structure (module ``tracker``'s docstring): its key in
    whole pages of ``page_size``, its slots int64 ``[len(key)]``, its parent's child, sharing
    its ``extra_key``, on the device (``inclusive``: backed up) only if its parent is."""
    n, parent = len(node.key), node.parent
    bad = [] if n and n % page_size == 0 else [f"node {node.id}: key length {n} is not pages"]
    for tier in TIERS:
        s = slots_on(node, tier)
        if s is not None and (s.dtype not in _INT64 or s.ndim != 1 or s.shape[0] != n):
            bad.append(f"node {node.id}: {tier} slots are not int64 [{n}]")
    if node.slots is None and node.host_slots is None:
        bad.append(f"node {node.id} holds neither device nor host slots")
    if parent is None or parent.children.get(node.child_key) is not node:
        return bad + [f"node {node.id} is not its parent's child"]
    if parent is not root:
        bad += [
            f"node {node.id}: {what}"
            for what, wrong in (
                ("extra_key differs from its parent's", node.extra_key != parent.extra_key),
                (
                    "on the device, its parent is not",
                    node.slots is not None and parent.slots is None,
                ),
                (
                    "backed up, its parent is not",
                    inclusive and node.host_slots is not None and parent.host_slots is None,
                ),
            )
            if wrong
        ]
    return bad
