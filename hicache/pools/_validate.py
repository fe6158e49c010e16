"""Argument checks shared by the pools (public input -> TypeError/ValueError naming it)."""

from __future__ import annotations

from typing import Any

import torch

from hicache import env
from hicache.kernels.validate import check_index_tensor


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` if an int ``>= minimum``: ``TypeError`` for a non-int, else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_slot_indices(name: str, indices: Any, limit: int) -> torch.Tensor:
    """``indices`` if a 1-D int64 tensor of slots in ``[0, limit)``: ``TypeError`` /
    ``ValueError``, or ``IndexError`` for a slot out of range, naming ``name``. The range is
    checked on CPU tensors, on CUDA ones only with ``HICACHE_CHECK_DEVICE_INDICES`` (a sync)."""
    indices = check_index_tensor(name, indices)
    if indices.numel() == 0 or (indices.device.type != "cpu" and not env.device_indices_checked()):
        return indices
    low, high = (int(v) for v in torch.aminmax(indices))
    if low < 0 or high >= limit:
        raise IndexError(f"{name} must lie in [0, {limit}), got values in [{low}, {high}]")
    return indices
