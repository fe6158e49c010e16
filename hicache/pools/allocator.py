"""Slot allocators: a page free list and the device token-to-KV allocator built on it.

Slots are token positions in a KV pool; a page is ``page_size`` consecutive slots starting at a
multiple of ``page_size``. Allocation hands out whole pages, so ``page_size == 1`` is the token
allocator and ``page_size > 1`` the paged one: one code path for both. The free list is an int64
numpy array of page ids and an ``allocated`` mask per page backs the double-free checks, so
alloc and free are array operations, never Python loops over slots. The bookkeeping is numpy
(single-threaded, no intra-op thread-pool wake-ups, ~0.5 us an op where a small torch op costs
2-5 us on the scheduler's path); tensors appear only at the API (``torch.from_numpy``, no copy).
``free``, given whole pages (what ``alloc`` hands out), works per page: one O(n) layout check,
then a sort of the page ids only. The free list is kept as runs of consecutive pages (their
lengths in ``_runs``, found once per merge): ``alloc`` within the first run is a slice and an
``arange``.
On CUDA the bookkeeping stays on the CPU too: ``alloc`` hands out a device tensor that carries
its CPU slots, a view of the slot ids kept on the device when the slots are one run
(``slot_ids.SlotIds``), else one non-blocking copy from pinned memory (``devices.to_device``),
and ``free`` reads those (``devices.host_copy``), so neither waits for the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hicache.checks import check_int
from hicache.devices import canonical_device
from hicache.pools.device_pool import KVPool
from hicache.pools.page_runs import (
    run_lengths,
    runs_hold,
    slots_to_free,
    sorted_unique,
    take_run,
    whole_pages,
)
from hicache.pools.slot_ids import SlotIds
from hicache.threads import ThreadBound


def _empty_pages() -> np.ndarray:
    return np.empty(0, dtype=np.int64)


class PageAllocator(ThreadBound):
    """Free list over pages ``reserved_pages .. reserved_pages + num_pages - 1``.

    Parameters
    ----------
    num_pages : usable pages (> 0).
    page_size : slots per page (>= 1).
    reserved_pages : leading pages never handed out (1 on the device: slot 0's page pads).

    State: every usable page is exactly one of free (``_free`` or ``_released``), pending (freed
    inside an open free group, back on the free list at ``free_group_end``) or allocated
    (``_allocated[page]``). ``check_invariants()`` verifies this. One thread changes it
    (``hicache.threads``): the calls in ``thread_guarded`` raise ``RuntimeError`` from another.
    """

    thread_guarded = "clear alloc_cpu free free_group_begin free_group_end"

    def __init__(self, num_pages: int, page_size: int, reserved_pages: int = 0) -> None:
        check_int("page_size", page_size, minimum=1)
        check_int("num_pages", num_pages, minimum=1)
        self.page_size = page_size
        self.num_pages = num_pages
        self.reserved_pages = reserved_pages
        self._lanes = np.arange(page_size, dtype=np.int64)  # a page's slot offsets
        self.clear()

    @property
    def slot_range(self) -> tuple[int, int]:
        """``[lo, hi)`` of the slots this allocator hands out."""
        return self.reserved_pages * self.page_size, self.end_page * self.page_size

    @property
    def end_page(self) -> int:
        return self.reserved_pages + self.num_pages

    def clear(self) -> None:
        """Free every usable page and drop any open free group."""
        self._free = np.arange(self.reserved_pages, self.end_page, dtype=np.int64)
        self._runs = run_lengths(self._free)  # _free, split into consecutive ascending runs
        self._released = _empty_pages()
        self._allocated = np.zeros(self.end_page, dtype=bool)
        self._group: list[np.ndarray] | None = None

    def available_size(self) -> int:
        """Slots that ``alloc`` can hand out now (pending group frees not included)."""
        return (self._free.size + self._released.size) * self.page_size

    def alloc_cpu(self, n: int) -> torch.Tensor | None:
        """``n`` slots in whole aligned pages (int64, CPU, ascending within each page), or None."""
        size = self.page_size
        ok = type(n) is int and n >= 0 and not n % size  # else ``_check_alloc_size`` raises
        num_pages = n // size if ok else self._check_alloc_size(n)
        if num_pages > self._free.size:
            self._merge_released()
        if num_pages > self._free.size:
            return None
        pages, self._free = self._free[:num_pages], self._free[num_pages:]
        if not take_run(self._runs, num_pages):  # pages of several runs
            self._allocated[pages] = True
            return torch.from_numpy(self._slots_of(pages))
        lo, hi = (int(pages[0]), int(pages[-1]) + 1) if num_pages else (0, 0)
        self._allocated[lo:hi] = True
        return torch.from_numpy(np.arange(lo * size, hi * size, dtype=np.int64))

    def free(self, indices: torch.Tensor) -> int:
        """Free the pages holding ``indices``; returns the number of slots freed.

        Freeing any slot of a page frees the whole page (a request's trailing partial page).
        ``indices`` on the CPU, or a device tensor that ``alloc`` handed out (its host copy is
        read), never ask the device; other device tensors are copied back first (a sync).
        Raises ``TypeError``/``ValueError`` before any change on a non-integer tensor, an
        out-of-range or reserved slot, a repeated slot, or a page that is not allocated.
        """
        pages = self._pages_to_free(indices)
        if pages.size == 0:
            return 0
        self._allocated[pages] = False
        if self._group is not None:
            self._group.append(pages)
        else:
            self._released = np.concatenate([self._released, pages])
        return pages.size * self.page_size

    def free_group_begin(self) -> None:
        """Defer the free-list update of the following ``free`` calls to ``free_group_end``."""
        if self._group is not None:
            raise RuntimeError("free_group_begin: a free group is already open")
        self._group = []

    def free_group_end(self) -> None:
        """Return every page freed since ``free_group_begin`` to the free list in one step."""
        if self._group is None:
            raise RuntimeError("free_group_end: no free group is open")
        group, self._group = self._group, None
        if group:
            self._released = np.concatenate([self._released, *group])

    def free_slots(self) -> torch.Tensor:
        """Every slot not allocated (free or pending in a group): sorted int64 CPU."""
        lo = self.reserved_pages
        return torch.from_numpy(self._slots_of(np.flatnonzero(~self._allocated[lo:]) + lo))

    def check_invariants(self) -> None:
        """Raise ``RuntimeError`` when the free list and the allocated mask disagree."""
        listed, repeated = sorted_unique(
            np.concatenate([self._free, self._released, *(self._group or [])])
        )
        if repeated:
            raise RuntimeError("allocator: a page is on the free list twice")
        if listed.size and int(listed[0]) < self.reserved_pages:
            raise RuntimeError("allocator: a reserved page is on the free list")
        unallocated = np.flatnonzero(~self._allocated[self.reserved_pages :])
        if not np.array_equal(listed, unallocated + self.reserved_pages):
            raise RuntimeError("allocator: free list and allocated mask disagree")
        if not runs_hold(self._free, self._runs):
            raise RuntimeError("allocator: the free list's leading run is not consecutive")

    def corrupt_free_list_for_testing(self) -> None:
        """Test-facing only: list the first free page twice, the corruption
        :meth:`check_invariants` must report. Never call it outside tests."""
        self._free = np.concatenate([self._free, self._free[:1]])
        self._runs.append(1)

    def _merge_released(self) -> None:
        # Sorted released pages go behind the free list: later allocations get ascending runs.
        if self._released.size:
            released = np.sort(self._released)
            self._free = np.concatenate([self._free, released])
            self._runs.extend(run_lengths(released))
            self._released = _empty_pages()

    def _slots_of(self, pages: np.ndarray) -> np.ndarray:
        """The slots of ``pages`` (a new int64 array, each page's slots ascending)."""
        if self.page_size == 1:
            return np.array(pages, dtype=np.int64)
        slots: np.ndarray = (pages[:, None] * self.page_size + self._lanes).ravel()
        return slots

    def _check_alloc_size(self, n: int) -> int:
        if type(n) is not int or n < 0:
            check_int("n", n, minimum=0)
        if n % self.page_size:
            raise ValueError(f"n must be a multiple of page_size={self.page_size}, got {n}")
        return n // self.page_size

    def _pages_to_free(self, indices: Any) -> np.ndarray:
        slots = slots_to_free(indices)
        if slots.size == 0:
            return _empty_pages()
        lo, hi = self.slot_range
        low, high = int(slots.min()), int(slots.max())
        if low < lo or high >= hi:
            raise ValueError(
                f"indices must lie in [{lo}, {hi}) (slots below {lo} are reserved), "
                f"got values in [{low}, {high}]"
            )
        whole = whole_pages(slots, self._lanes)
        if whole is not None:  # the common case: each slot once iff each page once
            pages, repeated = sorted_unique(whole)
        else:
            repeated = sorted_unique(slots)[1]
            pages = sorted_unique(slots // self.page_size)[0]
        if repeated:
            raise ValueError("indices contains a slot more than once")
        if not self._allocated[pages].all():
            bad = pages[~self._allocated[pages]][:4].tolist()
            raise ValueError(f"indices frees pages that are not allocated (double free?): {bad}")
        return pages


def _check_kvcache(kvcache: Any, size: int, page_size: int, device: torch.device) -> None:
    """``ValueError`` unless ``kvcache`` has this ``size``, ``page_size`` and (where it has one)
    ``device``."""
    if (kvcache.size, kvcache.page_size) != (size, page_size):
        raise ValueError(
            f"kvcache has size={kvcache.size}, page_size={kvcache.page_size}; "
            f"the allocator needs size={size}, page_size={page_size}"
        )
    pool_device = getattr(kvcache, "device", None)
    if pool_device is not None and canonical_device(pool_device, "kvcache.device") != device:
        raise ValueError(f"kvcache is on {pool_device}, the allocator on {device}")


class TokenToKVPoolAllocator(PageAllocator):
    """Allocator of device KV slots in whole pages; slot 0's page is reserved for padding.

    Parameters
    ----------
    size : usable slots, a positive multiple of ``page_size``; they are
        ``page_size .. size + page_size - 1``.
    page_size : slots per page; 1 gives the token allocator.
    device : where ``alloc`` returns its indices (the KV pool's device).
    kvcache : the device KV pool these slots index (``get_kvcache()``); its ``size``,
        ``page_size`` and (where it has one) ``device`` must match.
    """

    thread_guarded = PageAllocator.thread_guarded + " alloc alloc_pair"

    def __init__(
        self,
        size: int,
        page_size: int = 1,
        device: torch.device | str = "cpu",
        kvcache: KVPool | None = None,
    ) -> None:
        check_int("page_size", page_size, minimum=1)
        check_int("size", size, minimum=1)
        if size % page_size:
            raise ValueError(f"size must be a multiple of page_size={page_size}, got {size}")
        self.device = canonical_device(device)
        if kvcache is not None:
            _check_kvcache(kvcache, size, page_size, self.device)
        super().__init__(size // page_size, page_size, reserved_pages=1)
        self.size = size
        self._kvcache = kvcache
        self.slot_ids = SlotIds(size + page_size, self.device)  # every slot id, on the device

    def get_kvcache(self) -> KVPool | None:
        """The device KV pool (``MHATokenToKVPool`` / ``MLATokenToKVPool``) or None."""
        return self._kvcache

    def alloc(self, n: int) -> torch.Tensor | None:
        """``n`` slots (int64 on ``device``) in whole aligned pages, or None when short.

        ``n`` must be a non-negative multiple of ``page_size`` (``ValueError`` otherwise). On
        CUDA a view of the kept slot ids (one run) or one non-blocking copy from pinned memory,
        carrying the CPU slots: ``free`` reads them there instead of copying the device tensor
        back (a sync). Read-only, as every slot tensor hicache hands out.
        """
        slots = self.alloc_cpu(n)  # not ``alloc_pair``: wrapping one never reaches the other
        return None if slots is None else self.slot_ids.on_device(slots)

    def alloc_pair(self, n: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:meth:`alloc`, also returning the same slots on the CPU: ``(cpu, on_device)``.

        For callers that plan copies on the CPU (the direct io_backend): they need no
        device-to-host copy, which would wait for everything queued before it on the device.
        """
        slots = self.alloc_cpu(n)
        return None if slots is None else (slots, self.slot_ids.on_device(slots))
