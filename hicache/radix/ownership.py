"""Checks that slots handed to the tree are the caller's to give, before the tree takes them.

Every check runs on the slots' CPU values (the tree's slot metadata lives on the CPU, see
``radix.slots``): stored slots and CPU tensors as they are, a device tensor through its host
copy (``devices.host_copy``: free for the tensors hicache hands out, a sync for others). Levels
(the cost of each is what decides which):

* **Always** (O(n) vectorised numpy, plus a sort of the page ids): every slot lies in the
  allocator's usable range ``[page_size, size + page_size)`` (so never the reserved slot 0's
  page, never negative), the slots come in whole aligned pages (page ``k`` holds
  ``k * page_size .. k * page_size + page_size - 1`` in order; a trailing partial page is its
  first slots), and no page (hence no slot) appears twice.
* **Always, where tracked** (one gather per call, ``SlotOwners``): slots the tree is about to
  take are held by no node already.
* **Debug** (``HICACHE_CHECK_OWNERSHIP=1``; O(allocator) per call): those slots are allocated
  in the allocator (not free). Needs an allocator with ``free_slots()`` (hicache's
  ``TokenToKVPoolAllocator`` has it).

Everything raises ``ValueError`` naming the argument, and changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hicache import env
from hicache.devices import host_copy, same_device
from hicache.pools import SlotAllocator
from hicache.radix.key import RadixKey
from hicache.radix.slots import Slots, check_value

if TYPE_CHECKING:
    from hicache.radix.tree import RadixTree


def check_allocator(
    allocator: SlotAllocator | None, has_req_pool: bool, page_size: int
) -> torch.device:
    """The device of a cache's slots: the allocator's, or the CPU without one (or for a test
    double, a ``Mock``). ``ValueError`` when a request pool comes without an allocator or the
    allocator's integer ``page_size`` is not ``page_size``."""
    if has_req_pool and allocator is None:
        raise ValueError("req_to_token_pool needs a token_to_kv_pool_allocator")
    allocator_page = getattr(allocator, "page_size", page_size)
    if type(allocator_page) is int and allocator_page != page_size:  # not a test double's
        raise ValueError(f"page_size={page_size} differs from the allocator's {allocator_page}")
    device = getattr(allocator, "device", None)
    return torch.device(device) if isinstance(device, (str, torch.device)) else torch.device("cpu")


def slot_bounds(allocator: SlotAllocator | None) -> tuple[int, int] | None:
    """``[lo, hi)`` of the slots ``allocator`` hands out (slot 0's page is reserved), or None
    without an allocator or for a duck-typed one (a test double) without integer ``size`` and
    ``page_size``: its slots are then not range-checked or tracked. An allocator of two pools
    (``SWATokenToKVPoolAllocator``) hands out slots of its full pool (``size_full``)."""
    size = getattr(allocator, "size_full", getattr(allocator, "size", None))
    page = getattr(allocator, "page_size", None)
    if type(size) is not int or type(page) is not int:
        return None
    return page, size + page


def _fail(name: str, what: str) -> None:
    raise ValueError(f"{name} {what}")


SMALL = 64  # up to this many slots, ``check_pages`` loops in Python: fewer calls than numpy's


def check_pages(slots: Slots, name: str, allocator: SlotAllocator | None) -> None:
    """``ValueError`` unless ``slots`` (int ``[n]``) are in range, in whole aligned pages (the
    last page may be partial) and each page at most once. See the module docstring. One sort
    of the page starts settles both the range and the repeats; up to ``SMALL`` slots (a decode
    step's, a short suffix's) a Python loop does the same (each numpy call costs 1-3 us)."""
    ids = _to_host(slots)
    if ids.size == 0:
        return
    bounds = slot_bounds(allocator)
    if bounds is None:
        return
    lo, hi = bounds
    page = lo  # the reserved first page
    if ids.size <= SMALL:
        starts = _few_page_starts(ids.tolist(), name, page)
        low, high, repeated = min(starts), max(starts), len(set(starts)) < len(starts)
    else:
        ordered = np.sort(ids if page == 1 else _page_starts(ids, name, page))
        low, high = int(ordered[0]), int(ordered[-1])
        repeated = ordered.size > 1 and _any(ordered[1:] == ordered[:-1])
    if low < lo or high + page - 1 >= hi:
        _fail(
            name,
            f"must hold slots in [{lo}, {hi}) (slots below {lo} are reserved), "
            f"got pages spanning [{low}, {high + page - 1}]",
        )
    if repeated:
        _fail(name, "holds a slot more than once")


def _few_page_starts(ids: list[int], name: str, page: int) -> list[int]:
    """``_page_starts`` of a few slots, in Python."""
    starts = ids[::page]
    if any(v - k % page != starts[k // page] for k, v in enumerate(ids)) or any(
        s % page for s in starts
    ):
        _layout_fail(name, page)
    return starts


def _page_starts(ids: np.ndarray, name: str, page: int) -> np.ndarray:
    """The first slot of each page of ``ids``; ``ValueError`` unless every page is aligned and
    consecutive (the last one may be partial). Each slot minus its place in its page must be
    its page's first slot, a multiple of ``page``: a few whole-array numpy ops."""
    first = ids - _lanes(page, ids.size)  # each slot's page start, where the layout is right
    starts: np.ndarray = first[::page]
    whole = ids.size - ids.size % page
    if (
        _any(starts % page)
        or _any(first[:whole].reshape(-1, page) != starts[: whole // page, None])
        or _any(first[whole:] != starts[-1])
    ):
        _layout_fail(name, page)
    return starts


def _layout_fail(name: str, page: int) -> None:
    _fail(
        name,
        f"must come in whole aligned pages of {page} consecutive slots "
        "(a page's slots may not straddle two pages)",
    )


_LANES: dict[int, np.ndarray] = {}  # page size -> ``k % page`` for k in range(len), grown as needed


def _any(values: np.ndarray) -> bool:
    """Whether any of ``values`` is non-zero (``count_nonzero``: a third of ``.any()``'s cost
    on the small arrays of the scheduler's path)."""
    return bool(np.count_nonzero(values))


def _lanes(page: int, n: int) -> np.ndarray:
    """``[k % page for k in range(n)]`` (int64; a view of a cached array: never write it)."""
    lanes = _LANES.get(page)
    if lanes is None or lanes.size < n:
        lanes = _LANES[page] = np.arange(max(n, 1 << 16), dtype=np.int64) % page
    return lanes[:n]


class SlotOwners:
    """Which device slots the tree's nodes hold: one bool per slot of the allocator, kept in
    step by the cache (``take`` when a node gets device slots, ``release`` when slots go back
    to the allocator), so "owned by another node" is one gather per call.

    Kept on the CPU for the slots of any device (the tree's slots are CPU metadata); without
    an allocator with integer bounds (a pure index, a test double) every method is a no-op.
    """

    def __init__(self, allocator: SlotAllocator | None) -> None:
        bounds = slot_bounds(allocator)
        self._held = None if bounds is None else np.zeros(bounds[1], dtype=bool)

    def take(self, slots: Slots | torch.Tensor) -> None:
        if self._held is not None:  # stored slots (the common case) index without a call
            self._held[slots if isinstance(slots, np.ndarray) else _to_host(slots)] = True

    def release(self, slots: Slots | torch.Tensor) -> None:
        if self._held is not None:
            self._held[slots if isinstance(slots, np.ndarray) else _to_host(slots)] = False

    def held(self) -> np.ndarray | None:
        """The slots marked held, ascending (None when not tracked)."""
        return None if self._held is None else np.flatnonzero(self._held)

    def any_held(self, slots: Slots) -> bool:
        """Whether a node holds any of ``slots`` (in range: ``check_pages`` first)."""
        return self._held is not None and _any(self._held[_to_host(slots)])

    def check(self, slots: Slots, name: str) -> None:
        """``ValueError`` if a node holds any of ``slots`` (in range: ``check_pages`` first)."""
        if self.any_held(slots):
            _fail(name, "holds slots that a tree node already owns")


def check_allocated(slots: Slots, name: str, allocator: SlotAllocator | None) -> None:
    """Debug check (``HICACHE_CHECK_OWNERSHIP=1``, else a no-op): ``ValueError`` unless every
    slot of ``slots`` is allocated (not free) in ``allocator``; O(allocator) per call."""
    if not env.ownership_checked() or allocator is None:
        return
    ids = _to_host(slots)
    if ids.size and np.isin(ids, allocator.free_slots().numpy()).any():
        _fail(name, "holds slots that are free in the allocator (not allocated to the caller)")


def check_insert_value(
    key: RadixKey,
    value: Any,
    allocator: SlotAllocator | None,
    device: torch.device,
    owners: SlotOwners,
    tree: RadixTree,
) -> Slots | None:
    """``insert``'s checks of ``value`` (no state change): an integer tensor ``[len(key)]``,
    required with an allocator and then on its ``device``; its slots then pass ``check_pages``, and
    the slots the insert would take (past the device prefix ``tree`` caches) are held by no
    node (``owners``) and, under the debug switch, allocated. The cached prefix is looked up (a
    read-only walk) only when some slot is held or the debug switch is on: a fresh insert pays
    one gather. Returns ``value``'s CPU values (a view where it can be; None for None), read
    once: what the tree copies its slots from."""
    check_value(value, len(key))
    if value is None:
        if allocator is not None:
            raise ValueError("value is required: this cache frees its values to an allocator")
        return None
    if allocator is not None and not same_device(value.device, device):
        raise ValueError(f"value must be on the allocator's device {device}, got {value.device}")
    host = _to_host(value)
    if allocator is None or (slot_bounds(allocator) is None and not env.ownership_checked()):
        # A duck-typed allocator without integer size/page_size: check_pages has no range to
        # check and returns, and SlotOwners tracks nothing (it needs the bounds), so nothing
        # below can fail.
        return host
    check_pages(host, "value", allocator)
    end = len(key) - len(key) % tree.page_size
    if env.ownership_checked() or owners.any_held(host[:end]):
        new = host[tree.device_prefix(key)[0] : end]
        owners.check(new, "value")
        check_allocated(new, "value", allocator)
    return host


def _to_host(slots: Slots | torch.Tensor) -> np.ndarray:
    return slots if isinstance(slots, np.ndarray) else host_copy(slots).numpy()
