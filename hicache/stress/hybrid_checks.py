"""Checks of a hybrid stress run (``HybridHiRadixCache``), each returning violation messages.

- :func:`sweep_hybrid`: every cached token's full-attention KV (device and host copies), its
  sliding-window KV where the copy keeps it (device: not tombstoned; host: not
  ``host_swa_gone``), and every held recurrent state (device ``comp.state``, host
  ``comp.host_state``) equal the oracle's (:mod:`hicache.stress.hybrid_oracle`); copies still
  queued for transfer are skipped.
- :func:`check_served`: a prefix a request is about to use is usable: full KV of every token,
  SWA KV present and right for its last ``W`` tokens, and the state restored into the
  request's row is the one after the prefix.
- :func:`state_ownership` / :func:`swa_ownership`: every state slot (device, host) and every
  SWA slot is free or held by exactly one owner (a node or a live request): nothing leaks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np
import torch

from hicache.radix.components import host_state_of, host_swa_gone, is_tombstoned, state_of
from hicache.stress.checker import pending, walk
from hicache.stress.hybrid_oracle import (
    device_inner_rows,
    host_inner_rows,
    host_state_differs,
    kv_differences,
    state_code,
    state_differs,
)
from hicache.stress.workload import SALTS


class Parts(NamedTuple):
    """The pools a hybrid run reads back: device KV (composite), host KV (``HybridKVPoolHost``),
    device states (``MambaPool`` or None), host states (``MambaPoolHost`` or None), ``W``."""

    pool: Any
    host: Any
    states: Any
    host_states: Any
    window: int | None

    @property
    def inners(self) -> int:
        """Inner KV pools: 2 with an SWA pool (full, then SWA), else 1."""
        return len(self.pool.inner_pools)


def _copy(node: Any, ids: np.ndarray, slots: Any, skip: np.ndarray) -> tuple[np.ndarray, ...]:
    """(slots, tokens, positions, salts) of one copy of ``node`` without ``skip`` slots."""
    n = len(node.key)
    at = slots.cpu().numpy() if isinstance(slots, torch.Tensor) else np.asarray(slots)
    keep = ~np.isin(at, skip)
    cols = (at, ids[-n:].astype(np.int64), np.arange(len(ids) - n, len(ids)))
    salts = np.full(n, SALTS[node.extra_key], dtype=np.int64)
    return tuple(c[keep] for c in (*cols, salts))


def _compare(parts: Parts, tier: str, inner: int, rows: list[tuple[Any, ...]]) -> list[str]:
    """One read of every listed copy of ``tier`` in inner pool ``inner``; node by node on a
    difference, to name them."""
    read = device_inner_rows if tier == "device" else host_inner_rows
    source = parts.pool if tier == "device" else parts.host

    def diff(slots: np.ndarray, *cols: np.ndarray) -> list[str]:
        s = torch.from_numpy(slots)
        got = read(source, inner, s)
        return kv_differences(parts.pool, inner, got, s, (cols[0], cols[1], cols[2]))

    if not rows or not diff(*(np.concatenate(c) for c in zip(*(r[1:] for r in rows), strict=True))):
        return []
    what = "full" if inner == 0 else "SWA"
    return [
        f"node {node.id} {tier} {what} KV: {msg}" for node, *cols in rows for msg in diff(*cols)
    ]


def sweep_hybrid(cache: Any, parts: Parts) -> list[str]:
    """Every node's KV (full, SWA where kept) and states on both tiers hold the oracle's."""
    loads, writes = (x.numpy() for x in pending(cache.cache_controller))
    copies: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
    bad: list[str] = []
    for node, ids in walk(cache):
        comp = node.comp
        for tier, slots, skip, swa_kept in (
            ("device", node.slots, loads, not is_tombstoned(comp)),
            ("host", node.host_slots, writes, not host_swa_gone(comp)),
        ):
            if slots is None:
                continue
            row = (node, *_copy(node, ids, slots, skip))
            for inner in range(parts.inners if swa_kept else 1):
                copies.setdefault((tier, inner), []).append(row)
        bad += _node_states(parts, node, ids)
    for (tier, inner), rows in copies.items():
        bad += _compare(parts, tier, inner, rows)
    return bad


def _node_states(parts: Parts, node: Any, ids: np.ndarray) -> list[str]:
    comp, bad = node.comp, []
    code = state_code(ids, SALTS[node.extra_key])
    device, host = state_of(comp), host_state_of(comp)
    if device is not None and state_differs(parts.states, device, code):
        bad.append(f"node {node.id}: device state slot {device} is not the state after its path")
    if host is not None and host_state_differs(parts.host_states, parts.states, host, code):
        bad.append(f"node {node.id}: host state slot {host} is not the state after its path")
    return bad


def check_served(
    parts: Parts,
    prefix: torch.Tensor,
    tokens: list[int],
    salt: int,
    state: int | None,
    skip: torch.Tensor,
) -> list[str]:
    """The prefix at device ``prefix`` slots (``skip``: still loading) is usable: see the
    module docstring; ``state`` is the request row's state slot (after the restore)."""
    n = prefix.numel()
    if n == 0:
        return []
    ids = np.asarray(tokens[:n], dtype=np.int64)
    slots = prefix.cpu()
    keep = ~torch.isin(slots, skip)
    cols = (ids[keep.numpy()], np.arange(n)[keep.numpy()], np.full(int(keep.sum()), salt))
    at = slots[keep]
    bad = kv_differences(parts.pool, 0, device_inner_rows(parts.pool, 0, at), at, cols)
    if parts.inners > 1 and parts.window is not None:
        bad += _served_window(parts, slots, ids, salt, skip)
    if parts.states is not None and (
        state is None or state_differs(parts.states, state, state_code(ids, salt))
    ):
        bad.append(f"served a {n}-token prefix whose restored state is not the one after it")
    return [f"served prefix: {msg}" for msg in bad]


def _served_window(
    parts: Parts, slots: torch.Tensor, ids: np.ndarray, salt: int, skip: torch.Tensor
) -> list[str]:
    """The last ``W`` tokens' SWA KV: present (mapped) and right."""
    assert parts.window is not None
    first = max(0, len(ids) - parts.window)
    last = slots[first:]
    if bool((parts.pool.inner_slots(last.to(parts.pool.device))[1] == 0).any()):
        return [f"a token of its last {parts.window} (the window) has no SWA KV (tombstoned)"]
    keep = ~torch.isin(last, skip)
    positions = np.arange(first, len(ids))[keep.numpy()]
    cols = (ids[positions], positions, np.full(positions.size, salt))
    at = last[keep]
    return kv_differences(parts.pool, 1, device_inner_rows(parts.pool, 1, at), at, cols)


def _owned_once(name: str, owners: list[int], free: int, size: int) -> list[str]:
    if len(set(owners)) != len(owners):
        return [f"{name}: a slot is owned twice"]
    if len(owners) + free != size:
        return [f"{name}: {len(owners)} owned + {free} free != {size} slots (leaked or double)"]
    return []


def state_ownership(cache: Any, parts: Parts, rows: Iterable[int | None]) -> list[str]:
    """Device state slots: tree states + live requests' row states + free == the pool; host
    state slots: the tree's host states + free == the host pool."""
    if parts.states is None:
        return []
    nodes = [node for node, _ in walk(cache)]
    device = [s for s in (state_of(n.comp) for n in nodes) if s is not None]
    device += [s for s in rows if s is not None]
    host = [s for s in (host_state_of(n.comp) for n in nodes) if s is not None]
    states, host_states = parts.states, parts.host_states
    return _owned_once("device states", device, states.available_size(), states.size) + _owned_once(
        "host states", host, host_states.available_size(), host_states.size
    )


def swa_ownership(cache: Any, allocator: Any, requests: list[torch.Tensor]) -> list[str]:
    """Every SWA slot free or mapped from one full slot a node (not tombstoned) or a live
    request owns."""
    full = [torch.as_tensor(n.slots) for n, _ in walk(cache) if n.slots is not None]
    owned = torch.cat([t.cpu() for t in full + requests] or [torch.empty(0, dtype=torch.int64)])
    mapped = allocator.translate_loc_from_full_to_swa(owned.to(allocator.device)).cpu()
    mapped = mapped[mapped != 0].tolist()
    swa = allocator.swa_attn_allocator
    return _owned_once("SWA slots", mapped, swa.available_size(), swa.size)
