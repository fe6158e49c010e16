"""Slot indices as the tree stores them: validation, private copies, concatenation.

A node stores its slots (``TreeNode.slots``, ``TreeNode.host_slots``) as a private int64
array ``[n]`` of type :data:`Slots`: a numpy array when the slots are on the CPU (a pure index,
CPU pools, host slots), a torch tensor on the slots' device otherwise. CPU slots live in numpy
because a numpy array costs less than a tensor to make, slice and free (about 0.4 us each on the
insert and evict paths), and because torch routes CPU copies of more than ~32k elements through its
intra-op thread pool, whose wake-up costs milliseconds on a busy 2-core host, while a
single-threaded memcpy of a few MB takes microseconds. Whatever leaves the tree through the
public API is a torch tensor (``concat_slots``, ``as_tensor``, and the ``TreeNode.value`` /
``host_value`` properties).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch

Slots = np.ndarray | torch.Tensor  # see the module docstring

_INT_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})


def _host(value: Slots) -> np.ndarray:
    return value if isinstance(value, np.ndarray) else value.numpy()


def concat_slots(values: list[Slots], device: torch.device) -> torch.Tensor:
    """A new int64 tensor ``[sum of lengths]`` holding ``values`` (stored slots or tensors) end
    to end, on the values' device, or on ``device`` when ``values`` is empty."""
    if not values:
        return torch.empty(0, dtype=torch.int64, device=device)
    first = values[0]
    if isinstance(first, np.ndarray) or first.is_cpu:
        # always a new array (a copy when there is one: half the cost of a concatenate)
        joined = (
            _host(first).copy() if len(values) == 1 else np.concatenate(list(map(_host, values)))
        )
        return torch.from_numpy(joined.astype(np.int64, copy=False))
    return torch.cat(cast(list[torch.Tensor], values)).to(torch.int64)  # all on one device


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


def copy_slots(value: Slots, start: int = 0, end: int | None = None) -> Slots:
    """A private int64 copy of ``value[start:end]`` in the stored form (numpy for CPU slots);
    shares no memory with ``value``."""
    if isinstance(value, np.ndarray):
        return value[start:end].astype(np.int64)  # astype copies
    if value.is_cpu:
        return value.numpy()[start:end].astype(np.int64)
    return value[start:end].to(torch.int64, copy=True)


def as_tensor(slots: Slots) -> torch.Tensor:
    """Stored slots as a torch tensor sharing their memory (read it, never write it)."""
    return torch.from_numpy(slots) if isinstance(slots, np.ndarray) else slots


def stored_form(value: Slots | None) -> Slots | None:
    """``value`` (None, a tensor or a numpy array) in the stored form, without a copy: a CPU
    tensor becomes its numpy view; ``TypeError`` for anything else."""
    if value is None or isinstance(value, np.ndarray):
        return value
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"slots must be a torch.Tensor, a numpy array or None, got {type(value).__name__}"
        )
    return value.numpy() if value.is_cpu else value


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
