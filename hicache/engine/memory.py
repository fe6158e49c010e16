"""KV slot accounting: page rounding, reservations, eviction when short, growing request rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from hicache.devices import cat_slots, slice_slots, to_device
from hicache.engine.hybrid import HybridMemory
from hicache.engine.request import Request
from hicache.pools import ReqToTokenPool, TokenToKVPoolAllocator
from hicache.radix import HybridRadixCache, MatchResult, RadixKey, TreeNode
from hicache.tp import Vote


class Admission(NamedTuple):
    """An admitted request's start: its request row, prefix slots (the device hit, then any
    loaded from the host; int64, allocator device), the node locked on its behalf and the match."""

    row: int
    prefix: torch.Tensor
    node: TreeNode
    match: MatchResult


def load_back(cache: Any, match: MatchResult, locked: TreeNode) -> tuple[torch.Tensor, TreeNode]:
    """Queue the host part of ``match`` for loading (``init_load_back``) and move the request's
    lock from ``locked`` to the deepest loaded node. Returns the request's prefix slots (device
    hit, then the loaded ones) and the node now locked; just the device hit when nothing loads."""
    loaded, node = cache.init_load_back(match.last_host_node, match.host_hit_length)
    if len(loaded) == 0:
        return match.device_indices, locked
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(locked)
    if match.device_prefix_len == 0:  # all from the host, on the allocator's device
        return loaded, node
    return cat_slots([match.device_indices, loaded.to(match.device_indices.device)]), node


class _Growth(NamedTuple):
    """A ``grow`` awaiting its agreement: the requests, the slots each lacked, this rank's
    allocation (None: it failed here) and its carried vote."""

    reqs: list[Request]
    extras: list[int]
    slots: torch.Tensor | None
    vote: Vote


class SlotBudget:
    """Hands device slots to requests so that admitted requests can always finish.

    A request admitted holds a *reservation*: every slot it will still allocate
    (``pending(req)``). A new request is admitted only while the free slots plus what the cache
    can evict cover all reservations, so decode never runs out of memory.

    Under tensor parallelism every outcome of this rank's own allocations (a request row, KV
    slots) is agreed over ``cache.tp``: unless every rank got what it asked for, the ranks that
    did free it, and all take the same branch. Agreements ride on collectives the step makes
    anyway: a host hit's row is a condition of its load-back's agreement
    (``TPGroup.condition``), the step's slots are carried to the load issue's settle
    (``grow`` / ``confirm``).

    With a ``HybridRadixCache`` (``hybrid``, a ``HybridMemory``) a row also takes a state slot
    and gets the matched state restored, reservations must fit the SWA pool too, and SWA slots
    outside every live window are freed (``evict_swa``) before full KV is evicted.
    """

    def __init__(
        self, cache: Any, allocator: TokenToKVPoolAllocator, req_to_token_pool: ReqToTokenPool
    ) -> None:
        self.cache = cache
        self.allocator = allocator
        self.req_to_token_pool = req_to_token_pool
        self.page_size = allocator.page_size
        self.tp = cache.tp
        self.evicted_tokens = 0
        self._growth: _Growth | None = None
        hybrid = isinstance(cache, HybridRadixCache)
        self.hybrid = HybridMemory(cache, allocator, req_to_token_pool) if hybrid else None

    def round_up(self, n: int) -> int:
        return -(-n // self.page_size) * self.page_size

    def pending(self, req: Request) -> int:
        """Slots ``req`` will still allocate before it finishes."""
        return self.round_up(req.kv_total) - req.kv_capacity

    def never_fits(self, req: Request) -> str | None:
        """Why ``req`` can never be served by these pools, or None when it can."""
        max_len = self.req_to_token_pool.max_context_len
        if max(req.kv_total + 1, self.round_up(req.kv_total)) > max_len:
            return (
                f"request {req.rid} needs {req.kv_total + 1} tokens of context; "
                f"the engine's max context is {max_len}"
            )
        if self.round_up(req.kv_total) > self.allocator.size:
            return (
                f"request {req.rid} needs {req.kv_total} KV slots; "
                f"the device pool holds {self.allocator.size}"
            )
        return None

    def headroom(self, active: Iterable[Request]) -> int:
        """Slots obtainable now (free + evictable) minus the reservations of ``active``."""
        reserved = sum(self.pending(r) for r in active)
        obtainable = self.allocator.available_size() + self.cache.evictable_size()
        swa = None if self.hybrid is None else self.hybrid.swa_obtainable()
        return (obtainable if swa is None else min(obtainable, swa)) - reserved

    def admit(self, key: RadixKey, kv_total: int, active: Iterable[Any]) -> Admission | None:
        """Match ``key``, lock the hit, and take a request row when a request of ``kv_total``
        tokens fits beside the reservations of ``active``; then load back its host hit. None,
        with nothing held, when it does not fit (try later)."""
        match = self.cache.match_prefix(key)
        node = match.last_device_node
        self.cache.inc_lock_ref(node)
        fits = self.round_up(kv_total) - match.device_prefix_len <= self.headroom(active)
        rows = self._alloc_row() if fits else None
        if fits and match.host_hit_length > 0 and self.tp.active:
            admitted = self._admit_loading(rows, match, node)
            if admitted is None:
                return None
            rows, prefix, node = admitted
        else:
            rows = self.tp.keep_if_all(rows, self.req_to_token_pool.free, where="engine admission")
            if rows is None:
                self.cache.dec_lock_ref(node)
                return None
            prefix = match.device_indices
            if match.host_hit_length > 0:
                prefix, node = load_back(self.cache, match, node)
        if self.hybrid is not None:
            loaded = len(prefix) > match.device_prefix_len
            state = self.cache.device_state(node) if loaded else match.state_slot
            self.hybrid.restore(state, rows[0])
        return Admission(rows[0], prefix, node, match)

    def _admit_loading(
        self, rows: list[int] | None, match: MatchResult, node: TreeNode
    ) -> tuple[list[int], torch.Tensor, TreeNode] | None:
        """Under TP, the row and the load-back of a host hit in one agreement: the row's
        outcome is a condition of the load's (``TPGroup.condition``), so a row missing on any
        rank also gives the load back. Returns the row, prefix and locked node; None, with
        nothing held (``node`` unlocked), when a rank got no row."""
        with self.tp.condition(rows is not None, where="engine admission") as vote:
            prefix, node = load_back(self.cache, match, node)
        if vote.ok:
            assert rows is not None
            return rows, prefix, node
        assert node is match.last_device_node, "a refused admission loaded nothing"
        if rows is not None:
            self.req_to_token_pool.free(rows)
        self.cache.dec_lock_ref(node)
        return None

    def _alloc_row(self) -> list[int] | None:
        if self.hybrid is not None and self.hybrid.states is not None:
            return self.hybrid.alloc_row()
        return self.req_to_token_pool.alloc(1)

    def state_room(self, finished: bool) -> None:
        """Before ``cache_finished_req`` (``finished``) or ``cache_unfinished_req``: a free
        state slot for the checkpoint the cache's policy takes there (``HybridMemory``)."""
        if self.hybrid is not None:
            self.hybrid.state_room(finished)

    def alloc(self, n: int) -> torch.Tensor | None:
        """``n`` slots (a page multiple), evicting unlocked cache entries when short.

        A node whose host backup is still in flight is locked, so not evictable, until its ack
        is retired; a reservation may have counted it. When eviction falls short, wait for the
        transfers in flight (``drain_transfers``: a CUDA sync; nothing on CPU or without a host
        tier), retire them and evict again. Each outcome is agreed over the TP ranks.
        """
        slots = self._agreed(self._evict_and_alloc(n), "engine slot allocation")
        if slots is None:
            self.cache.drain_transfers()
            slots = self._agreed(self._evict_and_alloc(n), "engine slot allocation after drain")
        return slots

    def _agreed(self, slots: torch.Tensor | None, where: str) -> torch.Tensor | None:
        """``slots`` when every rank got its own, else None with ``slots`` freed."""
        return self.tp.keep_if_all(slots, self.allocator.free, where=where)

    def _evict_and_alloc(self, n: int) -> torch.Tensor | None:
        """Evict until ``n`` slots are free (SWA tombstones first for a hybrid model; full
        KV again while evicting frees slots but not enough, e.g. tombstoned leaves), alloc."""
        if self.hybrid is not None:
            self.hybrid.swa_room(n)
        short = n - self.allocator.available_size()
        while short > 0:
            evicted = self.cache.evict(short)
            self.evicted_tokens += evicted
            short = n - self.allocator.available_size() if evicted else 0
        return self.allocator.alloc(n)

    def grow(self, parts: Sequence[tuple[Request, int]]) -> torch.Tensor:
        """Make each request's row name slots for its next ``n`` tokens (``kv_len .. kv_len +
        n - 1``), the pages they lack allocated at once.

        Returns those slots, request after request: ``[sum of n]`` int64 on the table's device.
        Under TP the allocation's agreement is carried (``TPGroup.carry``) to the step's next
        collective: the slots stand once ``confirm`` returns True. Raises ``RuntimeError`` when
        the reservations made at admission cannot be honoured (a bookkeeping bug).
        """
        self.confirm()  # a growth a failed step left unconfirmed
        extras = [self.round_up(req.kv_len + n) - req.kv_capacity for req, n in parts]
        total = sum(e for e in extras if e > 0)
        if total:
            reqs = [req for req, _ in parts]
            slots = self._evict_and_alloc(total)
            vote = self.tp.carry(slots is not None, where="engine slot allocation")
            if slots is not None:
                self._extend(reqs, extras, slots)
            self._growth = _Growth(reqs, extras, slots, vote)
            if vote.ok is not None:  # one rank: decided now
                self.confirm()
        return self.new_slots(parts)

    def confirm(self) -> bool:
        """Agree on the last ``grow``'s allocation where no collective has yet (``resolve``);
        True when its slots stand. Else every rank gives back what it got, allocates again
        (agreed, draining transfers when short) and returns False: read the step's slots
        again (``new_slots``)."""
        growth, self._growth = self._growth, None
        if growth is None:
            return True
        self.tp.resolve(where="engine slot allocation")
        if growth.vote.ok:
            return True
        if growth.slots is not None:
            for req, extra in zip(growth.reqs, growth.extras, strict=True):
                req.kv_capacity -= max(extra, 0)
            self.allocator.free(growth.slots)
        slots = self.alloc(sum(e for e in growth.extras if e > 0))
        if slots is None:
            rids = [req.rid for req, e in zip(growth.reqs, growth.extras, strict=True) if e > 0]
            raise RuntimeError(f"out of KV slots for admitted request(s) {rids}")
        self._extend(growth.reqs, growth.extras, slots)
        return False

    def _extend(self, reqs: list[Request], extras: list[int], slots: torch.Tensor) -> None:
        """Append ``slots`` (the allocator's) to the rows of ``reqs``: ``extras[i]`` of them to
        the i-th (none where it is not positive)."""
        start = 0
        for req, extra in zip(reqs, extras, strict=True):
            if extra <= 0:
                continue
            cols = slice(req.kv_capacity, req.kv_capacity + extra)
            piece = slice_slots(slots, start, start + extra)  # keeps the host copy: no read
            self.req_to_token_pool.write((req.req_pool_idx, cols), piece, trusted=True)
            req.kv_capacity += extra
            start += extra

    def new_slots(self, parts: Sequence[tuple[Request, int]]) -> torch.Tensor:
        """The slots of each request's next ``n`` tokens, read from the table's CPU copy in
        one numpy gather (a slice for one request) and moved to its device at once."""
        pool = self.req_to_token_pool
        table = pool.req_to_token_cpu.numpy()
        if not parts:
            return torch.empty(0, dtype=torch.int64, device=pool.device)
        if len(parts) == 1:
            req, n = parts[0]
            picked = table[req.req_pool_idx, req.kv_len : req.kv_len + n]
        else:
            lens = np.array([n for _, n in parts], dtype=np.int64)
            starts = np.array([req.kv_len for req, _ in parts], dtype=np.int64)
            rows = np.repeat([req.req_pool_idx for req, _ in parts], lens)
            ends = np.cumsum(lens)
            cols = np.arange(ends[-1]) + np.repeat(starts - ends + lens, lens)
            picked = table[rows, cols]
        return to_device(torch.from_numpy(picked.astype(np.int64)), pool.device)
