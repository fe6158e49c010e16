"""The stress "model" of a hybrid model: its KV through a composite pool, and its recurrent state.

KV: a hybrid model's device pool (``SWAKVPool`` / ``HybridLinearKVPool``) is made of plain inner
pools, the full-attention one first; :func:`write_kv_hybrid` writes each inner pool's share at
its own slots (``inner_slots``: SWA slots through the allocator's map) with :mod:`oracle`'s
values, the SWA pool's under another salt (:data:`SWA_SALT`), so a full layer's KV served for
an SWA layer's is caught. Host copies are read per inner host pool (``HybridKVPoolHost``).

State: the recurrent state after a prefix is a function of the whole prefix, here of a code
(:func:`state_code`: CRC of its tokens and namespace) spread over every element of every state
tensor and layer (:func:`state_rows`), small integers exact in any float dtype. A request's
state row is written after each "forward" (:func:`write_state`); checks read a device slot
(:func:`state_differs`) or a host slot's bytes (:func:`host_state_differs`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hicache.stress.oracle import device_rows, differences, expected_rows, host_rows, write_kv
from hicache.stress.workload import SALTS

SWA_SALT = len(SALTS)  # added to a token's salt in the SWA inner pool


def inner_salt(salt: Any, inner: int) -> Any:
    """The salt of inner pool ``inner`` (0: full attention, 1: sliding window)."""
    return salt + SWA_SALT * inner


def write_kv_hybrid(
    pool: Any, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, salt: int
) -> None:
    """Every attention layer's KV of ``tokens`` at allocator ``slots`` (int64 ``[n]``), each
    inner pool at its own slots, like a forward pass."""
    loc = slots.to(pool.device)
    for k, (inner, at) in enumerate(zip(pool.inner_pools, pool.inner_slots(loc), strict=True)):
        write_kv(inner, at, tokens, positions, inner_salt(salt, k))


def kv_differences(
    pool: Any,
    inner: int,
    read: torch.Tensor,
    slots: torch.Tensor,
    cols: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> list[str]:
    """Where rows ``read`` (``[n, layers * parts, ...]`` of inner pool ``inner``) differ from
    the oracle's for ``(tokens, positions, salts)``; ``slots`` name the rows in messages."""
    tokens, positions, salts = cols
    inner_pool = pool.inner_pools[inner]
    want = expected_rows(inner_pool, tokens, positions, inner_salt(salts, inner))
    return differences(inner_pool, read, want, slots)


def device_inner_rows(pool: Any, inner: int, slots: torch.Tensor) -> torch.Tensor:
    """Inner pool ``inner``'s rows of allocator ``slots`` (CPU ``[n, layers * parts, ...]``)."""
    at = pool.inner_slots(slots.to(pool.device))[inner]
    return device_rows(pool.inner_pools[inner], at)


def host_inner_rows(host: Any, inner: int, slots: torch.Tensor) -> torch.Tensor:
    """Inner host pool ``inner``'s rows of host ``slots`` (CPU ``[n, layers * parts, ...]``)."""
    return host_rows(host.host_pools[inner], slots)


# ---- recurrent states ------------------------------------------------------------------------


def state_code(tokens: Sequence[int] | np.ndarray, salt: int) -> int:
    """The state after ``tokens`` in namespace ``salt``, as one number."""
    data = np.asarray(tokens, dtype=np.int64).tobytes()
    return zlib.crc32(data, salt + 1)


def state_rows(state_pool: Any, code: int) -> list[torch.Tensor]:
    """The state ``code`` stands for: per state tensor (``state_pool.state_tensors`` order),
    ``[layers, ...]`` of one slot (CPU, the tensor's dtype)."""
    rows = []
    for k, info in enumerate(state_pool.state_tensors):
        t = info.tensor
        shape = (t.shape[0], *t.shape[2:])
        n = int(np.prod(shape))
        mixed = (torch.arange(n, dtype=torch.int64) * 2_654_435 + code * 40_503 + k * 7_919) % 251
        rows.append((mixed - 125).view(shape).to(t.dtype))
    return rows


def write_state(state_pool: Any, slot: int, code: int) -> None:
    """Store the state ``code`` stands for in device slot ``slot`` (a forward's update)."""
    for info, row in zip(state_pool.state_tensors, state_rows(state_pool, code), strict=True):
        info.tensor[:, slot] = row.to(info.tensor.device)


def state_differs(state_pool: Any, slot: int, code: int) -> bool:
    """Whether device slot ``slot`` holds another state than ``code``'s."""
    rows = state_rows(state_pool, code)
    return any(
        not torch.equal(info.tensor[:, slot].cpu(), row)
        for info, row in zip(state_pool.state_tensors, rows, strict=True)
    )


def host_state_differs(host_states: Any, state_pool: Any, slot: int, code: int) -> bool:
    """Whether host slot ``slot`` (a ``MambaPoolHost``'s) holds another state than ``code``'s
    (its bytes: every state tensor, layer by layer, as ``state_copies`` lays them out)."""
    want = torch.cat(
        [
            layer.contiguous().view(-1).view(torch.uint8)
            for row in state_rows(state_pool, code)
            for layer in row
        ]
    )
    return not torch.equal(host_states.page_bytes(slot), want)
