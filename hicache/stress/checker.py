"""Checks a stress scenario runs against a HiRadixCache, each returning violation messages.

- :func:`ownership`: every device slot is free, in exactly one tree node, held by exactly one
  live request or kept for a pending write; every host slot is free or in exactly one tree node.
- :func:`namespace`: a match never reaches a node of another ``extra_key``.
- :func:`sweep`: every cached token's KV, on the device and on the host, equals the oracle's
  value for (token, position, layer, namespace); copies still queued for transfer are skipped.
  It reads layer by layer (``device_kv``/``host_kv``), apart from the incremental checks'
  whole-row readers (``device_rows``/``host_rows``), so each cross-checks the other.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any

import numpy as np
import torch

from hicache.stress.oracle import (
    device_kv,
    device_rows,
    differences,
    expected_rows,
    host_kv,
    mismatches,
)
from hicache.stress.workload import SALTS

_EMPTY = torch.empty(0, dtype=torch.int64)


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.cpu() for t in tensors]) if tensors else _EMPTY


def walk(cache: Any) -> Iterator[tuple[Any, np.ndarray]]:
    """Every node below the root with the token ids from the root to its end."""
    stack = [(child, child.key) for child in cache.root.children.values()]
    while stack:
        node, ids = stack.pop()
        yield node, ids
        stack.extend((c, np.concatenate([ids, c.key])) for c in node.children.values())


def _claims(
    name: str,
    all_slots: torch.Tensor,
    free: torch.Tensor,
    owners: list[torch.Tensor],
    reserved: int = 0,
) -> list[str]:
    held = _cat(owners)
    if held.unique().numel() != held.numel():
        return [f"{name}: a slot is owned twice"]
    claimed = torch.cat([free.cpu(), held])
    if claimed.unique().numel() != claimed.numel():
        return [f"{name}: a slot is both free and owned (freed while in use)"]
    if claimed.numel() + reserved != all_slots.numel() or not bool(
        torch.isin(claimed, all_slots).all()
    ):
        missing = all_slots[~torch.isin(all_slots, claimed)][:8].tolist()
        return [f"{name}: slots leaked (neither free, owned nor reserved): {missing}"]
    return []


def ownership(
    cache: Any,
    allocator: Any,
    host_pool: Any,
    request_slots: list[torch.Tensor],
    all_device: torch.Tensor,
    all_host: torch.Tensor,
    host_reserved: int = 0,
) -> list[str]:
    """Every slot free or owned once; ``host_reserved`` host slots (reserved by a storage
    prefetch, not yet adopted) may be neither. Device slots a pending write still reads
    (``cache.host_tier.held()``) count as owned until it lands."""
    nodes = [node for node, _ in walk(cache)]
    device = [n.value for n in nodes if not n.evicted] + request_slots
    device.append(cache.host_tier.held())
    host = [n.host_value for n in nodes if n.backuped]
    return _claims("device", all_device, allocator.free_slots(), device) + _claims(
        "host", all_host, host_pool.free_slots(), host, host_reserved
    )


def namespace(nodes: list[Any], extra_key: Hashable) -> list[str]:
    """Every node a match reached must live in the namespace it was asked for."""
    return [
        f"a match for extra_key={extra_key!r} reached node {n.id} of {n.extra_key!r}"
        for n in nodes
        if n.extra_key != extra_key
    ]


def path_to(cache: Any, node: Any) -> list[Any]:
    path = []
    while node is not None and node is not cache.root:
        path.append(node)
        node = node.parent
    return path[::-1]


def pending(controller: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(device slots of queued loads, host slots of queued writes): their bytes are not there
    yet. On CUDA everything issued is synchronized first, so only queued work is pending."""
    if controller.mem_pool_device.device.type == "cuda":
        torch.cuda.synchronize()
    loads = _cat([op.device_indices for op in controller.load_queue])
    writes = _cat([op.host_indices for op in controller.write_queue])
    return loads, writes


def check_prefix(
    pool: Any, slots: torch.Tensor, tokens: list[int], salt: int, skip: torch.Tensor = _EMPTY
) -> list[str]:
    """The device KV at ``slots`` is that of ``tokens[:len(slots)]`` (except ``skip`` slots)."""
    slots = slots.cpu()
    keep = ~torch.isin(slots, skip)
    if not bool(keep.any()):
        return []
    ids = torch.tensor(tokens[: slots.numel()], dtype=torch.int64)[keep]
    positions = torch.arange(slots.numel())[keep]
    slots = slots[keep]
    return differences(
        pool, device_rows(pool, slots), expected_rows(pool, ids, positions, salt), slots
    )


def sweep(cache: Any) -> list[str]:
    """Every tree node's device and host copy holds the oracle's KV: one batch per tier, then
    node by node to name the nodes when a batch differs."""
    ctrl = cache.cache_controller
    dev_pool, host_pool = ctrl.mem_pool_device, ctrl.mem_pool_host
    copies = (
        (lambda n: n.value, device_kv, dev_pool, "device"),
        (lambda n: n.host_value, host_kv, host_pool, "host"),
    )
    nodes = list(walk(cache))
    bad: list[str] = []
    for (get, reader, pool, tier), skip in zip(copies, pending(ctrl), strict=True):
        read = lambda layer, part, s, r=reader, p=pool: r(p, layer, part, s)  # noqa: E731
        rows = [
            (node, *_rows(node, ids, get(node), skip.numpy()))
            for node, ids in nodes
            if get(node) is not None
        ]
        if not rows:
            continue
        slots, *columns = (np.concatenate(c) for c in zip(*(r[1:] for r in rows), strict=True))
        if mismatches(dev_pool, read, torch.from_numpy(slots), *columns):
            bad += [
                f"node {node.id} {tier} copy: {msg}"
                for node, slots, *cols in rows
                for msg in mismatches(dev_pool, read, torch.from_numpy(slots), *cols)
            ]
    return bad


def _rows(
    node: Any, ids: np.ndarray, slots: torch.Tensor, skip: np.ndarray
) -> tuple[np.ndarray, ...]:
    """(slots, tokens, positions, salts), int64 numpy, of one copy of ``node`` (whose path
    holds ``ids``), without the slots still in flight (``skip``)."""
    n, at = len(node.key), slots.cpu().numpy()
    keep = ~np.isin(at, skip) if skip.size else slice(None)
    positions = np.arange(len(ids) - n, len(ids))
    salts = np.full(n, SALTS[node.extra_key], dtype=np.int64)
    return at[keep], ids[-n:].astype(np.int64)[keep], positions[keep], salts[keep]
