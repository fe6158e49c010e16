"""A shadow of one KV tier's slots: who owns each, and what each was last verified to hold.

The :class:`~hicache.stress.tracker.Tracker` moves ownership here as nodes and requests take and
give up slots, op by op; :meth:`TierShadow.settle` then checks the moves against the pool's free
list. Owners are tagged: a tree node by its id (>= 0), live request ``k`` by ``-3 - k``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

FREE, RESERVED = -1, -2
UNKNOWN = -1  # content of a slot not verified since it last changed hands
_FIELD = 1 << 20  # packed content: (salt * _FIELD + token) * _FIELD + position
_NONE = np.empty(0, np.int64)


def owner_name(tag: int) -> str:
    if tag == RESERVED:
        return "the reserved slots"
    return f"node {tag}" if tag >= 0 else f"live request {-3 - tag}"


def pack(tokens: np.ndarray, positions: np.ndarray, salt: int) -> np.ndarray:
    """One int64 per row naming (salt, token, position) of a node's ascending positions;
    all UNKNOWN when a field does not fit."""
    if (
        not tokens.size
        or int(tokens.view(np.uint64).max()) >= _FIELD
        or not (0 <= salt < _FIELD and int(positions[-1]) < _FIELD)
    ):  # negative tokens wrap
        return np.full(tokens.shape, UNKNOWN, np.int64)
    return (salt * _FIELD + tokens) * _FIELD + positions


class TierShadow:
    """Ownership and verified content of every slot of one tier.

    Parameters
    ----------
    name : "device" or "host" (for messages); pool : its allocator (``free_slots()``,
        ``available_size()``); every : int64 numpy, every slot the pool can hand out.
    reserved : how many slots are reserved outside any owner (a storage prefetch's host
        slots: neither free nor owned until adopted or released).
    """

    def __init__(
        self, name: str, pool: Any, every: np.ndarray, reserved: Callable[[], int] = int
    ) -> None:
        self.name, self.pool, self.every, self.reserved = name, pool, every, reserved
        self.bound = int(every.max()) + 1
        self.owner = np.full(self.bound, RESERVED, np.int64)
        self.owner[every] = FREE
        self.content = np.full(self.bound, UNKNOWN, np.int64)
        self.claims: dict[int, np.ndarray] = {}  # tag -> its slots
        self.held = self.in_tree = 0  # slots owned: by anyone, by tree nodes
        self.released: list[np.ndarray] = []  # this op's
        self.taken: list[np.ndarray] = []
        self.available = pool.available_size()  # after the last op

    def mask(self, slots: np.ndarray) -> np.ndarray:
        """A bool ``[bound]`` set at ``slots`` (those in range)."""
        mask = np.zeros(self.bound, bool)
        mask[slots[(slots >= 0) & (slots < self.bound)]] = True
        return mask

    def release(self, tag: int) -> None:
        slots = self.claims.pop(tag, None)
        if slots is not None:
            self.owner[slots] = FREE
            self.held -= slots.size
            self.in_tree -= slots.size if tag >= 0 else 0
            self.released.append(slots)

    def claim(self, tag: int, slots: np.ndarray) -> list[str]:
        who = f"{self.name}: {owner_name(tag)}"
        if slots.dtype != np.int64 or slots.ndim != 1:
            return [f"{who} holds slots of dtype {slots.dtype}, shape {slots.shape}"]
        if slots.size and int(slots.view(np.uint64).max()) >= self.bound:  # negatives wrap
            return [f"{who} holds slots out of range: {slots[:8].tolist()}"]
        owners = self.owner[slots]
        if (owners != FREE).any():
            k = int(np.flatnonzero(owners != FREE)[0])
            return [
                f"{self.name}: slot {int(slots[k])} is owned twice: by {owner_name(tag)} "
                f"and by {owner_name(int(owners[k]))}"
            ]
        self.owner[slots] = tag
        self.claims[tag] = slots
        self.held += slots.size
        self.in_tree += slots.size if tag >= 0 else 0
        self.taken.append(slots)
        if tag < 0:
            self.content[slots] = UNKNOWN  # a request writes its slots
        return []

    def settle(self) -> list[str]:
        """After an op's releases and claims: no owner holds a slot twice; slots given up and
        not taken again are free (their content forgotten); slots taken are not free. The free
        list is read only when slots went to or came from it, or ``available_size()`` moved."""
        released, taken = (np.concatenate(x) if x else _NONE for x in (self.released, self.taken))
        self.released, self.taken = [], []
        bad = []
        if (
            taken.size
            and np.count_nonzero((self.owner >= 0) | (self.owner < RESERVED)) != self.held
        ):
            bad.append(f"{self.name}: an owner holds one slot twice")
        gave = released[self.owner[released] == FREE]
        self.content[gave] = UNKNOWN
        moved = np.zeros(self.bound, bool)
        moved[released] = True
        available, fresh = self.pool.available_size(), taken[~moved[taken]]
        if gave.size or fresh.size or available != self.available:
            free = self.mask(self.pool.free_slots().numpy())
            both, lost = taken[free[taken]], gave[~free[gave]]
            if both.size:
                bad.append(
                    f"{self.name}: slots {both[:8].tolist()} are owned and free at once "
                    "(freed while in use)"
                )
            if lost.size > self.reserved():  # else checked by ``count``
                bad.append(
                    f"{self.name}: slots leaked (given up, neither free nor owned): "
                    f"{lost[:8].tolist()}"
                )
        self.available = available
        return bad

    def count(self) -> list[str]:
        """Owned + reserved + ``available_size()`` covers the pool exactly."""
        free, size, reserved = self.pool.available_size(), self.every.size, self.reserved()
        if free + self.held + reserved == size:
            return []
        return [
            f"{self.name}: {free} free + {self.held} owned + {reserved} reserved != {size} "
            "slots (a slot leaked or is counted twice)"
        ]
