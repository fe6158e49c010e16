"""Slot-index tensors as the tree stores them: validation, private copies, concatenation.

Stored values are int64 tensors on whatever device the caller's slots live. CPU tensors are
copied through numpy: torch routes CPU copies of more than ~32k elements through its intra-op
thread pool, whose wake-up costs milliseconds on a busy 2-core host, while a single-threaded
memcpy of a few MB takes microseconds (and numpy's small-copy overhead is lower). Other devices
use torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_INT_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})


def concat_slots(values: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """A new int64 tensor ``[sum of lengths]`` holding ``values`` end to end.

    On the values' device, or on ``device`` when ``values`` is empty.
    """
    if not values:
        return torch.empty(0, dtype=torch.int64, device=device)
    if values[0].device.type == "cpu":
        joined = np.concatenate([v.numpy() for v in values])  # always a new array
        return torch.from_numpy(joined.astype(np.int64, copy=False))
    return torch.cat(values).to(torch.int64)


def copy_slots(value: torch.Tensor, start: int = 0, end: int | None = None) -> torch.Tensor:
    """A private int64 copy of ``value[start:end]`` (shares no storage with ``value``)."""
    if value.is_cpu:
        return torch.from_numpy(value.numpy()[start:end].astype(np.int64))  # astype copies
    return value[start:end].to(torch.int64, copy=True)


def check_value(value: Any, key_len: int) -> None:
    """``TypeError``/``ValueError`` unless ``value`` is None or an integer tensor ``[key_len]``."""
    if value is None:
        return
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"value must be a torch.Tensor or None, got {type(value).__name__}")
    dtype = value.dtype
    if dtype not in _INT_DTYPES and (
        dtype.is_floating_point or dtype.is_complex or dtype == torch.bool
    ):
        raise TypeError(f"value must be an integer tensor, got dtype {dtype}")
    if value.dim() != 1 or value.shape[0] != key_len:
        raise ValueError(
            f"value must be 1-D with one slot per token ({key_len}), got shape "
            f"{tuple(value.shape)}"
        )


def head_slots(value: torch.Tensor | None, at: int) -> torch.Tensor | None:
    return None if value is None else copy_slots(value, 0, at)
