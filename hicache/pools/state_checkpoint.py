"""Checkpoints of a request's recurrent state: what a prefix cache keeps to resume a prefix.

A checkpoint is one ``MambaPool`` slot holding a copy of a request's state (every linear
layer's conv and temporal state) after some token. It maps to no request row: its owner (the
prefix cache, later) keeps it with the prefix and gives it back with :func:`release_states`.
Restoring copies it into the state slot of a new request's row; together with the prefix's
full-attention KV and the last ``sliding_window`` tokens' SWA KV, that request then continues
exactly as if it had computed the prefix itself. Both copies run on the pool's device
(``MambaPool.copy_from``), without a host sync; slots are read from the host bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hicache.pools.hybrid_req_pool import HybridReqToTokenPool


def checkpoint_states(req_pool: HybridReqToTokenPool, rows: Sequence[int]) -> torch.Tensor | None:
    """New state slots holding copies of live rows ``rows``' states (as the last forward left
    them): 1-D int64 on the pool's device, one per row; None, with nothing taken, when too few
    slots are free. ``ValueError`` naming ``rows`` for a row that is not allocated or whose
    state was released."""
    slots = _row_slots(req_pool, rows)
    return req_pool.mamba_pool.fork_from(slots)


def track_states(
    req_pool: HybridReqToTokenPool, rows: Sequence[int], track_idx: Sequence[int]
) -> None:
    """Copy live rows ``rows``' states into their track slots ``track_idx`` (one index per row,
    ``HybridReqToTokenPool.track_slot``): SGLang's decode tracking with the extra buffer.
    Checks precede the copy."""
    if len(track_idx) != len(rows):
        raise ValueError(f"track_idx must hold one index per row ({len(rows)}), got {track_idx}")
    slots = [req_pool.track_slot(row, idx) for row, idx in zip(rows, track_idx, strict=True)]
    dst = torch.tensor(slots, dtype=torch.int64, device=req_pool.mamba_pool.device)
    req_pool.mamba_pool.copy_from(_row_slots(req_pool, rows), dst)


def checkpoint_tracked(req_pool: HybridReqToTokenPool, row: int, idx: int) -> torch.Tensor | None:
    """A new state slot holding a copy of live row ``row``'s track slot ``idx`` (as
    :func:`checkpoint_states`, from the state :func:`track_states` kept there)."""
    slot = req_pool.track_slot(row, idx)
    src = torch.tensor([slot], dtype=torch.int64, device=req_pool.mamba_pool.device)
    return req_pool.mamba_pool.fork_from(src)


def restore_states(
    req_pool: HybridReqToTokenPool, checkpoints: torch.Tensor, rows: Sequence[int]
) -> None:
    """Overwrite live rows ``rows``' states with ``checkpoints`` (slots from
    :func:`checkpoint_states`, one per row); the checkpoints stay. Checks precede the copy."""
    slots = _row_slots(req_pool, rows)
    req_pool.mamba_pool.copy_from(checkpoints, slots)


def release_states(req_pool: HybridReqToTokenPool, checkpoints: torch.Tensor) -> None:
    """Give back checkpoint slots (``TypeError``/``ValueError`` for slots not allocated)."""
    req_pool.mamba_pool.free(checkpoints)


def _row_slots(req_pool: HybridReqToTokenPool, rows: Sequence[int]) -> torch.Tensor:
    if not isinstance(req_pool, HybridReqToTokenPool):
        raise TypeError(f"req_pool must be a HybridReqToTokenPool, got {type(req_pool).__name__}")
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise TypeError(f"rows must be a list of row ids, got {rows!r}")
    slots = [req_pool.state_slot(row) for row in rows]
    if None in slots:
        raise ValueError(f"rows: a row's state was released (state slots {slots})")
    return torch.tensor(slots, dtype=torch.int64, device=req_pool.mamba_pool.device)
