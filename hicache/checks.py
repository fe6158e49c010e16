"""Argument checks shared by every package (the ground floor: imports only ``env``).

Public input that is wrong raises ``TypeError`` (wrong type or dtype), ``ValueError`` (wrong value,
shape or choice) or ``IndexError`` (an index out of range), with a message naming the argument,
before the caller changes any state.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, TypeVar, cast

import torch

from hicache import env

T = TypeVar("T")


def check_unsupported_flag(name: str, value: object) -> None:
    """``TypeError`` unless ``value`` is a bool, ``ValueError`` if True: an SGLang flag taken
    for its signature (the memory saver, the transposed KV layout) whose feature hicache
    does not have."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    if value:
        raise ValueError(f"{name} must be False (hicache does not support it), got True")


def check_bool(name: str, value: object) -> bool:
    """``value`` if a ``bool``, else ``TypeError`` (``"no"``, ``1`` or ``None`` are not flags)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_int(name: str, value: Any, minimum: int = 0) -> int:
    """``value`` if an ``int`` (not ``bool``) ``>= minimum``: ``TypeError`` for a non-int, else
    ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_choice(name: str, value: object, allowed: Collection[T]) -> T:
    """``value`` if it is one of ``allowed``, else ``ValueError`` listing them."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
    return cast(T, value)  # it is one of ``allowed``


def check_index_tensor(
    name: str, idx: object, dtypes: tuple[torch.dtype, ...] = (torch.int64,)
) -> torch.Tensor:
    """``idx`` if a 1-D tensor of one of ``dtypes``: ``TypeError``/``ValueError`` naming
    ``name`` otherwise."""
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(idx).__name__}")
    if idx.dtype not in dtypes:
        allowed = "/".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} must be {allowed}, got {idx.dtype}")
    if idx.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(idx.shape)}")
    return idx


def check_slot_indices(
    name: str, indices: object, limit: int, dtypes: tuple[torch.dtype, ...] = (torch.int64,)
) -> torch.Tensor:
    """``indices`` if a 1-D tensor (of ``dtypes``) of slots in ``[0, limit)``: ``TypeError`` /
    ``ValueError``, or ``IndexError`` for a slot out of range, naming ``name``. The range is
    checked on CPU tensors, on CUDA ones only with ``HICACHE_CHECK_DEVICE_INDICES`` (a sync)."""
    tensor = check_index_tensor(name, indices, dtypes)
    if tensor.numel() == 0 or (tensor.device.type != "cpu" and not env.device_indices_checked()):
        return tensor
    low, high = (int(v) for v in torch.aminmax(tensor))
    if low < 0 or high >= limit:
        raise IndexError(f"{name} must lie in [0, {limit}), got values in [{low}, {high}]")
    return tensor
