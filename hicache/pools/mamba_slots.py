"""MambaSlots: the free list of a Mamba state pool's slots, kept on the CPU, with its checks."""

from __future__ import annotations

from collections import deque

import torch

from hicache import env
from hicache.checks import check_index_tensor, check_int

# Slot tensors may be int32: SGLang's callers pass ``get_mamba_indices`` (int32) results.
INDEX_DTYPES = (torch.int64, torch.int32)


class MambaSlots:
    """Slots ``1 .. size`` of a state pool (slot 0 pads and is never handed out).

    Slots are handed out oldest-freed first (FIFO, as SGLang's free list). Every check raises
    before anything changes.
    """

    def __init__(self, size: int) -> None:
        self.size = check_int("size", size, minimum=1)
        self._free: deque[int] = deque()
        self._used: set[int] = set()
        self.clear()

    def clear(self) -> None:
        """Every slot free."""
        self._free = deque(range(1, self.size + 1))
        self._used = set()

    def available_size(self) -> int:
        return len(self._free)

    def check_invariants(self) -> None:
        """``RuntimeError`` unless every slot ``1 .. size`` is exactly one of free (listed once)
        or allocated."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise RuntimeError("state slots: a slot is on the free list twice")
        if free & self._used or free | self._used != set(range(1, self.size + 1)):
            raise RuntimeError("state slots: the free list and the allocated set disagree")

    def is_allocated(self, slot: int) -> bool:
        return slot in self._used

    def take(self, n: int) -> list[int] | None:
        """``n`` free slots, now allocated, or None (nothing taken) when fewer are free."""
        check_int("need_size", n)
        if n > len(self._free):
            return None
        slots = [self._free.popleft() for _ in range(n)]
        self._used.update(slots)
        return slots

    def release(self, slots: list[int]) -> None:
        """Give back allocated slots, checked by :meth:`allocated`."""
        self._used.difference_update(slots)
        self._free.extend(slots)

    def allocated(self, name: str, index: object, *, distinct: bool = True) -> list[int]:
        """The slots of ``index`` (a 1-D int64 or int32 tensor, any device) once checked to be
        allocated (and ``distinct``): ``TypeError`` / ``ValueError`` / ``IndexError`` naming
        ``name``. The values are copied to the CPU (a sync for CUDA tensors)."""
        slots = check_index_tensor(name, index, INDEX_DTYPES).tolist()
        self.check_values(name, slots, distinct=distinct)
        return slots

    def check_values(self, name: str, slots: list[int], *, distinct: bool = True) -> None:
        """``IndexError`` for a slot outside ``[1, size]``, ``ValueError`` for a repeat (when
        ``distinct``) or a slot not allocated (free: a double free or never handed out)."""
        bad = [s for s in slots if not 1 <= s <= self.size]
        if bad:
            raise IndexError(f"{name} must lie in [1, {self.size}] (slot 0 pads), got {bad}")
        if distinct and len(set(slots)) != len(slots):
            raise ValueError(f"{name} must not repeat a slot, got {slots}")
        free = [s for s in slots if s not in self._used]
        if free:
            raise ValueError(
                f"{name} holds slots that are not allocated (freed already or never handed "
                f"out): {free}"
            )

    def check_if_visible(self, name: str, index: object, *, distinct: bool) -> None:
        """:meth:`allocated` for CPU tensors; for CUDA ones only the type and shape unless
        ``HICACHE_CHECK_DEVICE_INDICES`` (the values need a sync)."""
        tensor = check_index_tensor(name, index, INDEX_DTYPES)
        if tensor.device.type == "cpu" or env.device_indices_checked():
            self.check_values(name, tensor.tolist(), distinct=distinct)


def index_tensor(slots: list[int], device: torch.device) -> torch.Tensor:
    """``slots`` as a 1-D int64 tensor on ``device``."""
    return torch.tensor(slots, dtype=torch.int64, device=device)
