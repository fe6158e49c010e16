"""ReqToTokenPool: one row per live request, mapping token positions to KV slots."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch

from hicache.devices import canonical_device
from hicache.pools._validate import check_int


class ReqToTokenPool:
    """Rows of ``req_to_token`` (``[size, max_context_len]``, int32, ``device``) for requests.

    Row ``r``, column ``p`` holds the KV slot of token ``p`` of the request owning row ``r``.
    Rows are handed out by ``alloc`` and returned by ``free``; the table itself is not cleared.
    """

    def __init__(self, size: int, max_context_len: int, device: torch.device | str) -> None:
        self.size = check_int("size", size)
        self.max_context_len = check_int("max_context_len", max_context_len)
        self.device = canonical_device(device)
        self.req_to_token = torch.zeros(
            (size, max_context_len), dtype=torch.int32, device=self.device
        )
        self.clear()

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        """``n`` free row ids, or None when fewer than ``n`` are free."""
        check_int("n", n, minimum=0)
        if n > len(self._free):
            return None
        rows, self._free = self._free[:n], self._free[n:]
        self._used.update(rows)
        return rows

    def free(self, idx: int | list[int]) -> None:
        """Return one row id or a list of them; ``TypeError`` for a non-integer (``bool``
        included) and ``ValueError`` if any is not in use; no change on either. Integer-like ids
        (numpy or 0-d torch integers) are accepted."""
        rows = [_row_id(r) for r in ([idx] if _is_scalar(idx) else list(idx))]
        if len(set(rows)) != len(rows) or not self._used.issuperset(rows):
            raise ValueError(f"idx must be distinct rows currently allocated, got {idx!r}")
        self._used.difference_update(rows)
        self._free.extend(rows)

    def is_allocated(self, idx: int) -> bool:
        """Whether row ``idx`` is handed out (allocated and not yet freed)."""
        return idx in self._used

    def write(self, indices: Any, values: torch.Tensor | int) -> None:
        """``req_to_token[indices] = values`` (any torch indexing: a row, ``(row, slice)``, ...)."""
        self.req_to_token[indices] = values

    def clear(self) -> None:
        """Every row free."""
        self._free: list[int] = list(range(self.size))
        self._used: set[int] = set()


def _is_scalar(idx: Any) -> bool:
    return not isinstance(idx, (list, tuple, range)) and getattr(idx, "ndim", 0) == 0


def _row_id(value: Any) -> int:
    """``value`` as a Python int; ``TypeError`` for bools and non-integers."""
    if isinstance(value, (bool, np.bool_)) or (
        isinstance(value, torch.Tensor) and value.dtype == torch.bool
    ):
        raise TypeError(f"idx must hold integer row ids, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"idx must hold integer row ids, got {value!r}") from None
