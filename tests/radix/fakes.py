"""Small stand-ins for the pools (PLAN.md interfaces) and whole-state helpers for radix tests."""

from __future__ import annotations

import torch

from hicache.radix import RadixCache, RadixKey, Req
from hicache.radix.invariants import format_tree, iter_nodes


class FakeAllocator:
    """Page allocator over slots ``page_size .. size + page_size - 1`` (slot 0's page reserved).

    Like ``TokenToKVPoolAllocator``: ``alloc`` hands out whole aligned pages; freeing any slot of
    a page frees the whole page; freeing an unallocated page raises ``ValueError``.
    """

    def __init__(self, size: int, page_size: int = 1) -> None:
        assert size % page_size == 0
        self.size, self.page_size, self.device = size, page_size, torch.device("cpu")
        self.num_pages = size // page_size
        self._free = list(range(1, self.num_pages + 1))
        self.freed_calls = 0

    def available_size(self) -> int:
        return len(self._free) * self.page_size

    def alloc(self, n: int) -> torch.Tensor | None:
        assert n % self.page_size == 0, "alloc needs whole pages"
        pages = n // self.page_size
        if pages > len(self._free):
            return None
        taken, self._free = self._free[:pages], self._free[pages:]
        return pages_to_slots(taken, self.page_size)

    def free(self, indices: torch.Tensor) -> None:
        self.freed_calls += 1
        pages = sorted({int(s) // self.page_size for s in indices.tolist()})
        if set(pages) & set(self._free) or any(p < 1 or p > self.num_pages for p in pages):
            raise ValueError(f"double free or bad slot in {pages}")
        self._free.extend(pages)

    def free_slots(self) -> torch.Tensor:
        return pages_to_slots(sorted(self._free), self.page_size)


class FakeReqToTokenPool:
    def __init__(self, size: int, max_context_len: int) -> None:
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32)
        self._free = list(range(size))

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        rows, self._free = self._free[:n], self._free[n:]
        return rows

    def free(self, idx: int) -> None:
        if idx in self._free:
            raise ValueError(f"row {idx} is not allocated")
        self._free.append(idx)

    def is_allocated(self, idx: int) -> bool:
        return 0 <= idx < self.req_to_token.shape[0] and idx not in self._free

    def write(self, indices, values) -> None:
        self.req_to_token[indices] = values

    def available_size(self) -> int:
        return len(self._free)


def pages_to_slots(pages: list[int], page_size: int) -> torch.Tensor:
    base = torch.tensor(pages, dtype=torch.int64)[:, None] * page_size
    return (base + torch.arange(page_size)).flatten()


def tree_prefixes(cache: RadixCache) -> dict[tuple, tuple[int, ...]]:
    """Every cached page-prefix ``(extra_key, *token ids)`` -> the slots of its last page."""
    out: dict[tuple, tuple[int, ...]] = {}
    p = cache.page_size
    stack = [(child, (child.extra_key,)) for child in cache.root.children.values()]
    while stack:
        node, prefix = stack.pop()
        ids = node.key.tolist()
        slots = [] if node.value is None else node.value.tolist()
        for i in range(0, len(ids), p):
            prefix = prefix + tuple(ids[i : i + p])
            out[prefix] = tuple(slots[i : i + p])  # () on a host-only node
        stack.extend((child, prefix) for child in node.children.values())
    return out


def snapshot(cache: RadixCache) -> tuple:
    """Everything observable about the tree, to assert a failed call changed nothing."""
    nodes = sorted(
        (n.id, n.lock_ref, n.hit_count, n.last_access_time, n.priority) for n in iter_nodes(cache)
    )
    sizes = (cache.evictable_size(), cache.protected_size(), cache.total_size())
    return format_tree(cache, max_tokens=10**9), tree_prefixes(cache), nodes, sizes


def tree_pages(cache: RadixCache) -> list[int]:
    page = cache.page_size
    return [
        s // page
        for n in iter_nodes(cache)
        if n.value is not None
        for s in n.value.tolist()[::page]
    ]


def req_pages(req: Req, table: torch.Tensor, page_size: int) -> set[int]:
    """Pages a live request owns: those under row positions [cache_protected_len, kv_len)."""
    row = table[req.req_pool_idx, req.cache_protected_len : req.kv_len].tolist()
    return {s // page_size for s in row}


def check_accounting(cache: RadixCache, allocator, table, reqs) -> None:
    """Every page is free, or owned by exactly one tree position or one live request.

    ``allocator`` is a FakeAllocator or a real ``TokenToKVPoolAllocator`` (``size``,
    ``page_size``, ``free_slots()``; usable pages ``1 .. size // page_size``).
    """
    owners = tree_pages(cache)
    assert len(owners) == len(set(owners)), "a page is owned twice inside the tree"
    owned = set(owners)
    for req in reqs:
        mine = req_pages(req, table, allocator.page_size)
        assert not mine & owned, "a page is owned by a request and by the tree/another request"
        owned |= mine
    free = {s // allocator.page_size for s in allocator.free_slots().tolist()}
    assert not owned & free, "an owned page is also free"
    assert owned | free == set(range(1, allocator.size // allocator.page_size + 1)), "leak"


def key(ids, extra_key=None) -> RadixKey:
    return RadixKey(ids, extra_key)
