"""Slot indices as the tree stores them: validation, private copies, concatenation.

A node stores its slots (``TreeNode.slots``, ``TreeNode.host_slots``) as a private int64 numpy
array ``[n]`` (:data:`Slots`), on the CPU whatever the pools' device: host metadata, device data
(STYLE #8). Reading device slots back would wait for the device (a sync on the scheduler's
path), so slots enter the tree as CPU values (the request table's CPU mirror, the allocator's
host copy of what it handed out: ``devices.host_copy``) and leave it as a device tensor made
by one non-blocking copy from pinned memory that carries its CPU copy (``concat_slots``,
``devices.to_device``). Numpy because an array costs less than a tensor to make, slice and
free (about 0.4 us each on the insert and evict paths), and because torch routes CPU copies
of more than ~32k elements through its intra-op thread pool, whose wake-up costs milliseconds
on a busy 2-core host, while a single-threaded memcpy of a few MB takes microseconds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hicache.devices import host_copy, to_device

Slots = np.ndarray  # see the module docstring

_INT_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})


def _host(value: Slots | torch.Tensor) -> np.ndarray:
    """``value`` as a CPU numpy array (a view where it can be)."""
    return value if isinstance(value, np.ndarray) else host_copy(value).numpy()


def concat_slots(values: list[Slots], device: torch.device) -> torch.Tensor:
    """A new int64 tensor ``[sum of lengths]`` holding ``values`` (stored slots or CPU tensors)
    end to end, on ``device``: on CUDA one non-blocking copy from pinned memory, carrying the
    CPU copy (``devices.to_device``)."""
    if len(values) == 1:  # always a new array (a copy: half the cost of a concatenate)
        joined = _host(values[0]).copy()
    else:
        joined = np.concatenate([_host(v) for v in values] or [np.empty(0, np.int64)])
    return to_device(torch.from_numpy(joined.astype(np.int64, copy=False)), device)


class SlotsToJoin:
    """Stored slot arrays (``parts``, ``length`` slots in all) that ``join`` makes into one
    tensor as ``concat_slots`` does (on ``device`` when ``parts`` is empty), when a caller asks.
    ``parts`` is kept, not copied: the tree's arrays, which it never writes in place."""

    __slots__ = ("parts", "device", "length")

    def __init__(self, parts: list[Slots], device: torch.device, length: int) -> None:
        self.parts, self.device, self.length = parts, device, length

    def __len__(self) -> int:
        return self.length

    def join(self) -> torch.Tensor:
        return concat_slots(self.parts, self.device)


def copy_slots(value: Slots | torch.Tensor, start: int = 0, end: int | None = None) -> Slots:
    """A private int64 numpy copy of ``value[start:end]``; shares no memory with ``value``. A
    device tensor is read through ``devices.host_copy`` (a sync unless hicache made it)."""
    return _host(value)[start:end].astype(np.int64)  # astype copies


def as_tensor(slots: Slots) -> torch.Tensor:
    """Stored slots as a CPU torch tensor sharing their memory (read it, never write it)."""
    return torch.from_numpy(slots)


def stored_form(value: Slots | torch.Tensor | None) -> Slots | None:
    """``value`` (None, a tensor or a numpy array) in the stored form, without a copy where it
    can be: a CPU tensor becomes its numpy view, a device tensor its CPU copy
    (``devices.host_copy``); ``TypeError`` for anything else."""
    if value is None or isinstance(value, np.ndarray):
        return value
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"slots must be a torch.Tensor, a numpy array or None, got {type(value).__name__}"
        )
    return _host(value)


def head_slots(value: Slots | None, at: int) -> Slots | None:
    return None if value is None else copy_slots(value, 0, at)


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
            f"value must be 1-D with one slot per token ({key_len}), got shape {tuple(value.shape)}"
        )
