"""What a request holds of a Mamba pool, read and checked (for ``HybridReqToTokenPool``).

A request is any object with these attributes (those SGLang's ``Req`` has):

- ``req_pool_idx``: its ``req_to_token`` row (int) or None; written by ``alloc``.
- ``mamba_pool_idx``: None, or its state slot as a 0-d int64 tensor on the pool's device
  (``alloc`` writes it; an int or one-element integer tensor is accepted when reused).
- with ``enable_mamba_extra_buffer`` only: ``mamba_ping_pong_track_buffer`` (None, or a 1-D
  int64 tensor of the track slots) and ``mamba_next_track_idx`` (int; ``alloc`` sets 0).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

_INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


class Held(NamedTuple):
    """Slots a request already holds: its state slot and track slots (None: to allocate)."""

    state: int | None
    track: list[int] | None


def read_held(req: Any, name: str, track_size: int | None) -> Held:
    """The slots ``req`` (called ``name`` in errors) holds; ``track_size`` None: no track
    buffers. ``TypeError`` for a missing attribute or a non-integer value, ``ValueError`` for a
    track buffer of the wrong length."""
    state = _attr(req, name, "mamba_pool_idx")
    if state is not None:
        state = _ints(f"{name}.mamba_pool_idx", state, 1)[0]
    if track_size is None:
        return Held(state, None)
    track = _attr(req, name, "mamba_ping_pong_track_buffer")
    if track is not None:
        track = _ints(f"{name}.mamba_ping_pong_track_buffer", track, track_size)
    return Held(state, track)


def _attr(req: Any, name: str, attr: str) -> Any:
    if not hasattr(req, attr):
        raise TypeError(f"{name} must have a {attr} attribute ({type(req).__name__} has none)")
    return getattr(req, attr)


def _ints(name: str, value: Any, count: int) -> list[int]:
    """``value`` (an int, or an integer tensor of ``count`` elements) as ``count`` ints."""
    if isinstance(value, int) and not isinstance(value, bool) and count == 1:
        return [value]
    if not isinstance(value, torch.Tensor) or value.dtype not in _INTS:
        raise TypeError(f"{name} must be an integer tensor, got {value!r}")
    if value.numel() != count or value.dim() > 1:
        raise ValueError(f"{name} must hold {count} slot(s), got shape {tuple(value.shape)}")
    ints: list[int] = value.reshape(-1).tolist()
    return ints
