"""ReqToTokenPool: one row per live request, mapping token positions to KV slots."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any, cast

import numpy as np
import torch

from hicache.checks import check_int, check_unsupported_flag
from hicache.devices import canonical_device, host_copy, to_device
from hicache.threads import ThreadBound

SLOT_LIMIT = 2**31  # req_to_token is int32: slot ids are in [0, SLOT_LIMIT)
_INTEGER_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
Columns = slice | int | torch.Tensor


class ReqToTokenPool(ThreadBound):
    """Rows of ``req_to_token`` (``[size, max_context_len]``, int32, ``device``) for requests.

    Row ``r``, column ``p`` holds the KV slot of token ``p`` of the request owning row ``r``.
    Rows are handed out by ``alloc`` and returned by ``free``; the table itself is not cleared.
    ``req_to_token_cpu`` is the table on the CPU, where the radix cache reads rows: the table
    itself on a CPU pool; on CUDA a mirror that ``write`` keeps in step (reading device rows
    would wait for the device), so on CUDA rows the cache reads must be written by ``write``.

    SGLang's keywords (``size``, ``max_context_len``, ``device``, ``enable_memory_saver``);
    the memory saver is not supported, so ``enable_memory_saver`` must be False. ``alloc`` and
    ``free`` take row counts and ids (SGLang before 0.5.9; later releases pass ``Req``
    objects): ``alloc(need_size)`` returns None when rows run out, where SGLang asserts. One
    thread changes it: ``thread_guarded`` calls raise ``RuntimeError`` from another.
    """

    thread_guarded = "alloc free write clear"

    def __init__(
        self,
        size: int,
        max_context_len: int,
        device: torch.device | str,
        enable_memory_saver: bool = False,
    ) -> None:
        check_unsupported_flag("enable_memory_saver", enable_memory_saver)
        self.size = check_int("size", size, minimum=1)
        self.max_context_len = check_int("max_context_len", max_context_len, minimum=1)
        self.device = canonical_device(device)
        shape = (size, max_context_len)
        self.req_to_token = torch.zeros(shape, dtype=torch.int32, device=self.device)
        self.req_to_token_cpu = (
            self.req_to_token
            if self.device.type == "cpu"
            else torch.zeros(shape, dtype=torch.int32)
        )
        self._cpu_rows = self.req_to_token_cpu.numpy()  # its memory: the writes' numpy view
        self._free: list[int] = []
        self._used: set[int] = set()
        self.clear()

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self, need_size: int) -> list[int] | None:
        """``need_size`` free row ids, or None when fewer are free."""
        n = need_size
        if type(n) is not int or n < 0:
            check_int("need_size", need_size, minimum=0)  # raises
        if n > len(self._free):
            return None
        rows, self._free = self._free[:n], self._free[n:]
        self._used.update(rows)
        return rows

    def free(self, free_index: int | list[int]) -> None:
        """Return one row id or a list of them; ``TypeError`` for a non-integer (``bool``
        included) and ``ValueError`` if any is not in use; no change on either. Integer-like ids
        (numpy or 0-d torch integers) are accepted."""
        if type(free_index) is int and free_index in self._used:  # one row: checked as is
            self._used.remove(free_index)
            self._free.append(free_index)
            return
        rows = self._checked_rows(free_index)
        self._used.difference_update(rows)
        self._free.extend(rows)

    def _checked_rows(self, idx: int | list[int], name: str = "free_index") -> list[int]:
        """The row ids of ``idx`` once checked as :meth:`free` takes them (nothing changes)."""
        ids: list[object] = [idx] if _is_scalar(idx) else list(cast(Iterable[object], idx))
        rows = [_row_id(r, name) for r in ids]
        if len(set(rows)) != len(rows) or not self._used.issuperset(rows):
            raise ValueError(f"{name} must be distinct rows currently allocated, got {idx!r}")
        return rows

    def is_allocated(self, idx: int) -> bool:
        """Whether row ``idx`` is handed out (allocated and not yet freed)."""
        return idx in self._used

    def write(self, indices: Any, values: torch.Tensor | int, *, trusted: bool = False) -> None:
        """``req_to_token[indices] = values``, checked first; nothing is written on error.

        Parameters
        ----------
        indices : a row id, or ``(row, cols)`` with ``cols`` a slice, a column id or a 1-D
            integer tensor of column ids. Ids are ints (numpy / 0-d torch integers too, never
            bools) in range: negative ids do not count from the end.
        values : KV slot ids in ``[0, 2**31)``: an int (written to every selected entry) or an
            integer tensor (any device, not bool) with exactly as many entries as ``indices``
            selects, at most 1-D.

        Raises ``TypeError`` for a non-integer (or bool) id or value, ``IndexError`` for a row or
        column out of range, ``ValueError`` for a slot id out of range or a length mismatch.
        Rows are not checked for being allocated. Ranges are checked on the CPU copies of
        tensors: CUDA tensors hicache handed out (``TokenToKVPoolAllocator.alloc``, the radix
        cache's indices) carry theirs, others are copied back (a device sync). On CUDA the CPU
        mirror gets the values, the table one non-blocking copy of them.

        ``trusted`` (keyword-only): ``hicache.engine``'s own write of slots the allocator or
        the tree handed out, ``indices`` a ``(row, slice)``: nothing is checked. Every other
        caller leaves it False.
        """
        if trusted:
            assert isinstance(values, torch.Tensor), "a trusted write of a slot tensor"
            row, cols = indices
            cpu = host_copy(values).numpy()  # in range: numpy casts as it stores on the CPU
            if self.req_to_token is self.req_to_token_cpu:  # ``_store``'s whole work there
                self._cpu_rows[row, cols] = cpu
            else:
                self._store(row, cols, values, cpu.astype(np.int32))
            return
        row, cols, count = self._target(indices)
        values = _slot_values(values, count)
        host: np.ndarray | int = values if isinstance(values, int) else host_copy(values).numpy()
        if isinstance(host, np.ndarray):
            _check_range("values", "slot ids", host, SLOT_LIMIT, ValueError)
            host = host.astype(np.int32)  # lossless: in range
        self._store(row, cols, values, host)

    def _store(
        self, row: int, cols: Columns, values: torch.Tensor | int, host: np.ndarray | int
    ) -> None:
        """Write checked ``values`` (``host``: their CPU form, int32 where the table is on
        CUDA) to the CPU table and, on CUDA, to the table (one non-blocking copy)."""
        host_cols = host_copy(cols).numpy() if isinstance(cols, torch.Tensor) else cols
        self._cpu_rows[row, host_cols] = host  # the table itself on the CPU
        if self.req_to_token is self.req_to_token_cpu:
            return
        if isinstance(cols, torch.Tensor) and isinstance(host_cols, np.ndarray):
            cols = cols.to(self.device) if cols.is_cuda else _on(host_cols, self.device)
        if isinstance(values, torch.Tensor) and isinstance(host, np.ndarray) and not values.is_cuda:
            values = _on(host, self.device)
        self.req_to_token[row, cols] = values  # one copy, casting a CUDA tensor's slot ids

    def clear(self) -> None:
        """Every row free."""
        self._free = list(range(self.size))
        self._used = set()

    def _target(self, indices: Any) -> tuple[int, Columns, int]:
        """``(row, cols, number of entries selected)`` of checked ``indices``."""
        if isinstance(indices, tuple) and len(indices) != 2:
            raise TypeError(f"indices must be a row or (row, cols), got {len(indices)} items")
        row, cols = indices if isinstance(indices, tuple) else (indices, slice(None))
        row = _bounded("indices", "row", row, self.size)
        width = self.max_context_len
        if isinstance(cols, slice):
            return row, cols, len(range(*cols.indices(width)))
        if isinstance(cols, torch.Tensor) and cols.dim() > 0:
            _check_integer_tensor("indices: cols", cols)
            if cols.dim() != 1:
                raise TypeError(f"indices: cols must be 1-D, got shape {tuple(cols.shape)}")
            _check_range("indices", "cols", host_copy(cols).numpy(), width, IndexError)
            return row, cols.to(torch.int64), cols.numel()
        return row, _bounded("indices", "col", cols, width), 1


def _on(host: np.ndarray, device: torch.device) -> torch.Tensor:
    """CPU values ``host`` on ``device`` (one non-blocking copy, ``devices.to_device``)."""
    return to_device(torch.from_numpy(host), device)


def _bounded(name: str, what: str, value: Any, limit: int) -> int:
    """``value`` as an int in ``[0, limit)``: ``TypeError`` / ``IndexError`` naming ``name``."""
    index = _row_id(value, name)
    if not 0 <= index < limit:
        raise IndexError(f"{name}: {what} {index} is outside [0, {limit})")
    return index


def _check_integer_tensor(name: str, tensor: torch.Tensor) -> None:
    """``TypeError`` unless an int8/16/32/64 or uint8 tensor; ``ValueError`` unless on the CPU
    or a CUDA device."""
    if tensor.dtype not in _INTEGER_DTYPES:
        raise TypeError(f"{name} must be an int8/16/32/64 or uint8 tensor, got {tensor.dtype}")
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be on the CPU or a CUDA device, got {tensor.device}")


def _check_range(name: str, what: str, values: np.ndarray, limit: int, error: type) -> None:
    """``error`` unless ``values`` lie in ``[0, limit)``: a min and a max (numpy: a small
    torch reduction costs several times as much on the scheduler's path)."""
    if values.size == 0:
        return
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= limit:
        raise error(f"{name}: {what} must lie in [0, {limit}), got values in [{low}, {high}]")


def _slot_values(values: Any, count: int) -> torch.Tensor | int:
    """``values`` once checked as the slot ids of a write of ``count`` entries (an int's range
    here, a tensor's by the caller on its CPU copy: any cast to the int32 table is then
    lossless)."""
    if isinstance(values, torch.Tensor):
        _check_integer_tensor("values", values)
        if values.dim() > 1 or values.numel() != count:
            raise ValueError(f"values has shape {tuple(values.shape)}; indices select {count}")
        return values  # its range is checked on its CPU copy
    if isinstance(values, bool) or not isinstance(values, int):
        raise TypeError(f"values must be an int or an integer tensor, got {type(values).__name__}")
    if not 0 <= values < SLOT_LIMIT:
        raise ValueError(f"values must be a slot id in [0, {SLOT_LIMIT}), got {values}")
    return values


def _is_scalar(idx: Any) -> bool:
    return not isinstance(idx, (list, tuple, range)) and getattr(idx, "ndim", 0) == 0


def _row_id(value: Any, name: str = "idx") -> int:
    """``value`` as a Python int; ``TypeError`` naming ``name`` for bools and non-integers."""
    if isinstance(value, (bool, np.bool_)) or (
        isinstance(value, torch.Tensor) and value.dtype == torch.bool
    ):
        raise TypeError(f"{name} must hold integer ids, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must hold integer ids, got {value!r}") from None
