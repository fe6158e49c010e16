"""Req: the fields of a request that ``cache_finished_req`` / ``cache_unfinished_req`` use.

The engine's own request type only needs the same attribute names (duck typing). Protocol:

1. schedule: ``m = cache.match_prefix(RadixKey(ids, extra_key))``; ``cache.inc_lock_ref(
   m.last_device_node)``; set ``prefix_indices = m.device_indices``, ``last_node =
   m.last_device_node``, ``cache_protected_len = len(m.device_indices)``; allocate slots for the
   rest and write the row ``req_to_token[req_pool_idx, :n]``.
2. after a prefill chunk: set ``kv_len``, call ``cache_unfinished_req(req)`` (optional).
3. when done: set ``kv_len`` (every token except the last sampled one) and call
   ``cache_finished_req(req)``.

Ownership: positions ``[0, cache_protected_len)`` of the row are the tree's slots (kept alive by
the lock on ``last_node``); positions ``[cache_protected_len, kv_len)`` are the request's own.
With ``page_size > 1`` a request holds whole pages; the unaligned tail ``[aligned, kv_len)`` lies
in its last page, which ``cache_finished_req`` frees by passing those slots to the allocator
(which frees whole pages). Row positions past ``kv_len`` are never read.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from hicache.checks import check_int
from hicache.pools import SlotAllocator
from hicache.radix.key import RadixKey, as_token_array
from hicache.radix.node import TreeNode
from hicache.radix.ownership import SlotOwners, check_allocated, check_pages
from hicache.radix.slots import Slots, copy_slots
from hicache.radix.tokens import RequestTokens, TokenBuffer
from hicache.radix.tree import RadixTree


def _empty_indices() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64)


@dataclass(eq=False)
class Req:
    """A request as the radix cache sees it.

    Attributes
    ----------
    req_pool_idx : row of ``ReqToTokenPool.req_to_token`` holding this request's slots.
    origin_input_ids : prompt token ids.
    output_ids : generated token ids so far.
    kv_len : leading tokens of ``origin_input_ids + output_ids`` whose KV slots are in the row
        (a prefill chunk's end; ``len(all) - 1`` once decoding, the last sample has no KV yet).
    extra_key : namespace (LoRA id, tenant salt); see ``RadixKey``.
    priority : raises the eviction priority of the nodes this request inserts.
    prefix_indices : int64 ``[m]`` slots of the cached prefix (tree's slots, then after
        ``cache_unfinished_req`` also the request's unaligned tail).
    last_node : node locked on the request's behalf, or None.
    cache_protected_len : leading row positions whose slots belong to the tree.
    """

    req_pool_idx: int
    origin_input_ids: Sequence[int]
    output_ids: list[int] = field(default_factory=list)
    kv_len: int = 0
    extra_key: Hashable | None = None
    priority: int = 0
    prefix_indices: torch.Tensor = field(default_factory=_empty_indices)
    last_node: TreeNode | None = None
    cache_protected_len: int = 0
    _tokens: RequestTokens | None = field(default=None, init=False, repr=False)

    @property
    def tokens(self) -> TokenBuffer:
        """``origin_input_ids + output_ids`` in a TokenBuffer (each token converted once, on
        first use; ``output_ids`` only grows, a replaced list is converted anew)."""
        if self._tokens is None:
            self._tokens = RequestTokens(self.origin_input_ids, self.output_ids)
        return self._tokens.get(self.origin_input_ids, self.output_ids)

    @property
    def fill_ids(self) -> list[int]:
        """``(origin_input_ids + output_ids)[:kv_len]`` (SGLang's name)."""
        return (list(self.origin_input_ids) + list(self.output_ids))[: self.kv_len]


def kv_key(req: Any) -> RadixKey:
    """RadixKey of the first ``req.kv_len`` tokens of ``origin_input_ids + output_ids``.

    ``ValueError`` unless ``cache_protected_len <= kv_len <= len(origin) + len(output)``.
    """
    origin, output, kv_len = req.origin_input_ids, req.output_ids, req.kv_len
    total = len(origin) + len(output)
    if isinstance(kv_len, bool) or not isinstance(kv_len, int):
        raise TypeError(f"req.kv_len must be an int, got {type(kv_len).__name__}")
    if not req.cache_protected_len <= kv_len <= total:
        raise ValueError(
            f"req.kv_len must be in [cache_protected_len={req.cache_protected_len}, "
            f"{total}] (prompt + output tokens), got {kv_len}"
        )
    tokens = getattr(req, "tokens", None)  # Req, engine.Request: a view of the buffer
    if isinstance(tokens, TokenBuffer):
        return RadixKey.from_validated(tokens.ids(kv_len), req.extra_key)
    head = as_token_array(origin[:kv_len])  # a duck-typed request: its lists, every call
    if kv_len <= len(origin):
        return RadixKey.from_validated(head, req.extra_key)
    tail = as_token_array(output[: kv_len - len(origin)])
    ids = np.concatenate([head, tail])
    ids.flags.writeable = False
    return RadixKey.from_validated(ids, req.extra_key)


def _row_id(pool: Any, req: Any) -> int:
    """``req.req_pool_idx`` as a row id ``pool`` has handed out (no state change)."""
    idx = req.req_pool_idx
    if idx is None:
        raise ValueError(
            "req.req_pool_idx is None: the request holds no row (never scheduled, "
            "or already finished: cache_finished_req releases the row)"
        )
    if isinstance(idx, (bool, np.bool_)):
        raise TypeError(f"req.req_pool_idx must be an int row id, got {idx!r}")
    try:
        idx = operator.index(idx)
    except TypeError:
        raise TypeError(
            f"req.req_pool_idx must be an int row id, got {type(req.req_pool_idx).__name__}"
        ) from None
    rows = pool.req_to_token.shape[0]
    if not 0 <= idx < rows:
        raise IndexError(f"req.req_pool_idx must be in [0, {rows}), got {idx}")
    if not pool.is_allocated(idx):
        raise ValueError(
            f"req.req_pool_idx={idx} is not an allocated row (a stale row id, or "
            "the request was already finished)"
        )
    return idx


def _check_lock(tree: RadixTree, req: Any, on_device: list[TreeNode]) -> None:
    """``req.last_node`` is locked and one of ``on_device`` (the device nodes along the
    request's tokens), and ``cache_protected_len`` (a page multiple) does not go past it."""
    protected, node, page = req.cache_protected_len, req.last_node, tree.page_size
    check_int("req.cache_protected_len", protected, minimum=0)
    if protected % page:
        raise ValueError(
            f"req.cache_protected_len must be a multiple of page_size={page}, got {protected}"
        )
    depth = 0
    if node is not None and node is not tree.root:
        if not isinstance(node, TreeNode):
            raise TypeError(f"req.last_node must be a TreeNode or None, got {type(node).__name__}")
        if node.own_lock_ref <= 0:
            raise ValueError(f"req.last_node (node {node.id}) is not locked")
        # on the request's device path (hence in this tree): its depth is the path up to it
        at = next((i for i, n in enumerate(on_device) if n is node), None)
        if at is None:
            raise ValueError(
                f"req.last_node (node {node.id}) is not in this tree on the "
                "device path of the request's tokens"
            )
        depth = sum(len(n.key) for n in on_device[: at + 1])
    if protected > depth:
        raise ValueError(
            f"req.cache_protected_len={protected} exceeds the {depth} tokens "
            "req.last_node keeps locked"
        )


def _row_slots(table: torch.Tensor, idx: int, n: int) -> Slots:
    """A private int64 copy of ``table[idx, :n]``. ``table`` is the CPU mirror where the pool
    keeps one (``ReqToTokenPool.req_to_token_cpu``: reading a device row back would wait for
    the device), read through numpy (a torch slice costs several times as much)."""
    if table.device.type == "cpu":
        return table.numpy()[idx, :n].astype(np.int64)
    return copy_slots(table[idx, :n])


class CheckedReq(NamedTuple):
    """A validated request: its row id, an int64 copy of its row ``[kv_len]``, the key of its
    whole pages and how many leading tokens of that key the tree holds on the device (None
    from ``trusted_req``: not looked up, the insert's walk finds it)."""

    row_id: int
    row: Slots
    key: RadixKey
    present: int | None


def check_req(
    req: Any,
    pool: Any,
    tree: RadixTree,
    allocator: SlotAllocator | None,
    owners: SlotOwners,
) -> CheckedReq:
    """Validate ``req`` for ``cache_*_req`` against ``pool`` (the request table) and ``tree``
    (no state change; the rules are in ``BasePrefixCache.cache_finished_req``). The request's
    own slots (positions ``[cache_protected_len, kv_len)``) are checked like ``insert``'s
    ``value`` (``radix.ownership``). The engine's own requests take ``trusted_req``."""
    if pool is None:
        raise ValueError("cache_*_req needs a req_to_token_pool")
    idx = _row_id(pool, req)
    key = kv_key(req)
    table = pool.req_to_token
    if len(key) > table.shape[1]:
        raise ValueError(
            f"req.kv_len={len(key)} exceeds the request pool's max_context_len={table.shape[1]}"
        )
    check_int("req.priority", req.priority, minimum=-(2**63))
    aligned = key[: len(key) - len(key) % tree.page_size]
    present, on_device = tree.device_prefix(aligned)
    _check_lock(tree, req, on_device)
    row = _row_slots(getattr(pool, "req_to_token_cpu", table), idx, len(key))
    own = row[req.cache_protected_len :]
    name = "req_to_token row (positions cache_protected_len..kv_len)"
    check_pages(own, name, allocator)
    owners.check(own, name)
    check_allocated(own, name, allocator)
    return CheckedReq(idx, row, aligned, present)


def trusted_req(req: Any, pool: Any, tree: RadixTree) -> CheckedReq:
    """``check_req`` of a request whose row, lock and own slots the engine made (``trusted``
    in ``cache_*_req``): its row is read, its key built (``kv_len`` checked), nothing else
    re-validated nor looked up (``present`` None). ``pool`` is not None."""
    idx, key = req.req_pool_idx, kv_key(req)
    assert isinstance(idx, int) and pool.is_allocated(idx), "trusted request without a row"
    n = len(key.token_ids)
    aligned = key if n % tree.page_size == 0 else key[: n - n % tree.page_size]  # immutable
    row = _row_slots(getattr(pool, "req_to_token_cpu", pool.req_to_token), idx, n)
    return CheckedReq(idx, row, aligned, None)
