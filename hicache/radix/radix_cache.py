"""RadixCache: the device-tier radix tree over KV slots (contract in ``base.BasePrefixCache``).

Layout: a node's ``key`` is an int32 numpy array of whole pages and ``slots`` its device slots
(stored form of ``slots.Slots``; the tensor-typed ``value`` property, which makes a tensor per
call, is for callers); walking along a key and splitting edges live in ``walk``.
Evictable leaves sit in a ``LeafSet`` ordered by the eviction policy and updated incrementally;
``_sync(node)`` re-files a node after anything its evictability depends on changed.

Hooks for a subclass with a host tier (``HiRadixCache``):
``_is_evictable_leaf`` which nodes the device ``evict`` may take (here: unlocked, on the device,
    childless; with a host tier: no child on the device);
``_evict_leaf`` what evicting one does (here: delete it; with a host tier: drop only the device
    copy of a backed-up node);
``_sync`` re-file a node in the ordered leaf set(s) (a host tier adds its host-leaf set);
``_delete_leaf`` unlink a leaf and re-file its parent;
``_on_hit`` a match or insert reached a node (access time, hit count, priority);
``_add_leaf`` a new leaf was created by an insert (e.g. start a write-through backup);
``_adopt`` an insert covers an existing node (e.g. take the slots of a host-only node);
``_free_device`` / ``_device_len`` release device slots / device tokens a node holds.
``match_prefix`` already walks host-only nodes: ``_match_result`` reports the device prefix,
``last_host_node`` and ``host_hit_length``.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from typing import Any

import numpy as np
import torch

from hicache.checks import check_int
from hicache.radix import invariants
from hicache.radix.base import (
    BasePrefixCache,
    MatchResult,
    ReqToTokenTable,
    SlotAllocator,
)
from hicache.radix.config import RadixCacheConfig
from hicache.radix.key import TOKEN_DTYPE, RadixKey, as_radix_key, edge_ids
from hicache.radix.node import ChildKey, TreeNode
from hicache.radix.ownership import SlotOwners, check_insert_value
from hicache.radix.policies import LeafSet
from hicache.radix.req import cache_finished, cache_unfinished
from hicache.radix.slots import Slots, concat_slots, copy_slots
from hicache.radix.walk import walk

_PRIORITY_MIN = -(2**63)


class RadixCache(BasePrefixCache):
    """Radix prefix cache over device KV slots; see ``BasePrefixCache`` for the contract.

    Parameters
    ----------
    req_to_token_pool : ``ReqToTokenPool`` (needed by ``cache_*_req``) or None.
    token_to_kv_pool_allocator : allocator evicted slots are freed to, or None. With both None
        the tree is a pure index whose values are the token ids.
    page_size : tokens per page (>= 1); must equal the allocator's.
    eviction_policy : ``lru``, ``lfu``, ``fifo``, ``mru``, ``filo`` or ``priority``.
    disable : match nothing and cache nothing (``cache_*_req`` just free).
    """

    def __init__(
        self,
        req_to_token_pool: ReqToTokenTable | None,
        token_to_kv_pool_allocator: SlotAllocator | None,
        page_size: int = 1,
        *,
        eviction_policy: str = "lru",
        disable: bool = False,
    ) -> None:
        self.config = RadixCacheConfig(page_size, eviction_policy, disable)
        allocator = token_to_kv_pool_allocator
        if req_to_token_pool is not None and allocator is None:
            raise ValueError("req_to_token_pool needs a token_to_kv_pool_allocator")
        if allocator is not None and allocator.page_size != page_size:
            raise ValueError(
                f"page_size={page_size} differs from the allocator's {allocator.page_size}"
            )
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = allocator
        self.page_size = page_size
        self.disable = disable
        self.device = torch.device("cpu") if allocator is None else torch.device(allocator.device)
        self._clock = itertools.count(1)
        self._scratch = np.empty(0, dtype=bool)  # reused by common_prefix_len
        self.slot_owners = SlotOwners(allocator)  # device slots held by nodes
        self._init_tree()

    def _init_tree(self) -> None:
        self.root = TreeNode(np.empty(0, TOKEN_DTYPE), self._no_indices(), None)
        self.root.lock_ref = 1  # the root is never evicted; lock walks stop below it
        self._evictable = LeafSet(self.config.eviction_policy)
        self._evictable_size = 0
        self._protected_size = 0

    # ---- queries and updates ---------------------------------------------------------------

    @property
    def root_node(self) -> TreeNode:
        """The root, under SGLang's name (same object as :attr:`root`)."""
        return self.root

    def match_prefix(self, key: Any) -> MatchResult:
        key = as_radix_key(key)
        if self.disable:
            return MatchResult(self._no_indices(), self.root, self.root, 0)
        path = walk(self, key.token_ids, key.extra_key)[0]
        tick = next(self._clock)
        for node in path:
            self._on_hit(node, tick)
        return self._match_result(path)

    def insert(self, key: Any, value: torch.Tensor | None = None, *, priority: int = 0) -> int:
        key = as_radix_key(key)
        check_insert_value(self, key, value)
        if type(priority) is not int or priority < _PRIORITY_MIN:
            check_int("priority", priority, minimum=_PRIORITY_MIN)
        if self.disable:
            return 0
        present, _ = self._insert(key, value, priority)
        return present

    def evict(self, num_tokens: int) -> int:
        check_int("num_tokens", num_tokens, minimum=0)
        freed: list[Slots] = []
        evicted = 0
        pop, evict_leaf = self._evictable.pop, self._evict_leaf
        while evicted < num_tokens:
            node = pop()
            if node is None:
                break
            evicted += evict_leaf(node, freed)
        self._free_device(freed)
        return evicted

    def inc_lock_ref(self, node: TreeNode) -> int:
        moved = 0
        for n in self._path_to_root(node):
            if n.lock_ref == 0:
                size = self._device_len(n)
                self._evictable_size -= size
                self._protected_size += size
                moved += size
                self._evictable.discard(n)
            n.lock_ref += 1
        if node is not self.root:
            node.own_lock_ref += 1
        return moved

    def dec_lock_ref(self, node: TreeNode) -> int:
        path = self._path_to_root(node)
        if path and node.own_lock_ref <= 0:
            held = "only through a locked descendant" if node.lock_ref > 0 else "at all"
            raise ValueError(
                f"dec_lock_ref: node {node.id} is not locked {held}; "
                "call it once per inc_lock_ref on the same node"
            )
        if path:
            node.own_lock_ref -= 1
        moved = 0
        for n in path:
            n.lock_ref -= 1
            if n.lock_ref == 0:
                size = self._device_len(n)
                self._evictable_size += size
                self._protected_size -= size
                moved += size
                self._sync(n)
        return moved

    def evictable_size(self) -> int:
        return self._evictable_size

    def protected_size(self) -> int:
        return self._protected_size

    def total_size(self) -> int:
        return self._evictable_size + self._protected_size

    # ---- requests ----------------------------------------------------------------------------

    def cache_finished_req(self, req: Any) -> None:
        cache_finished(self, req)

    def cache_unfinished_req(self, req: Any) -> None:
        cache_unfinished(self, req)

    # ---- whole tree --------------------------------------------------------------------------

    def reset(self) -> None:
        if self._protected_size:
            raise ValueError(
                f"reset: {self._protected_size} tokens are locked by live requests; "
                "finish or release them first"
            )
        self._free_device([n.slots for n in invariants.iter_nodes(self) if n.slots is not None])
        self._init_tree()

    def pretty_print(self) -> None:
        print(invariants.format_tree(self))

    def check_invariants(self) -> None:
        invariants.check_tree(self)

    # ---- internals and hooks -----------------------------------------------------------------

    def _insert(
        self, key: RadixKey, value: Slots | None, priority: int
    ) -> tuple[int, list[TreeNode]]:
        """Insert the whole pages of ``key``; returns (tokens already cached, path)."""
        ids = key.token_ids
        path, missing = walk(self, ids, key.extra_key)
        tick = next(self._clock)
        present = pos = 0
        for node in path:
            self._on_hit(node, tick, priority)
            present += self._adopt(node, value, pos)
            pos += len(node.key)
        if missing is not None:  # pages [pos, n) are new
            n = len(ids) - len(ids) % self.page_size
            slots = ids[pos:n].astype(np.int64) if value is None else copy_slots(value, pos, n)
            parent = path[-1] if path else self.root
            path.append(
                self._add_leaf(
                    parent, edge_ids(ids[pos:n]), slots, key.extra_key, tick, priority, missing
                )
            )
        return present, path

    def _match_result(self, path: list[TreeNode]) -> MatchResult:
        values, last_device, host_len = [], self.root, 0
        for node in path:
            if node.slots is None:
                host_len += len(node.key)
            else:
                values.append(node.slots)
                last_device = node
        indices = concat_slots(values, self.device)
        return MatchResult(indices, last_device, path[-1] if path else self.root, host_len)

    def _path_indices(self, path: list[TreeNode]) -> torch.Tensor:
        values = [node.slots for node in path]
        assert all(v is not None for v in values), "path has a node without a device copy"
        return concat_slots(values, self.device)

    def _add_leaf(
        self,
        parent: TreeNode,
        ids: np.ndarray,
        value: Slots,
        extra_key: Hashable | None,
        tick: int,
        priority: int,
        child_key: ChildKey,
    ) -> TreeNode:
        """Link a new leaf under ``parent`` at ``child_key`` (``walk.child_key`` of the leaf)."""
        leaf = TreeNode(ids, value, parent, extra_key, tick, priority)
        self.slot_owners.take(value)
        leaf.child_key = child_key
        parent.children[child_key] = leaf
        self._evictable_size += len(ids)
        self._sync(parent)
        self._sync(leaf)
        return leaf

    def _adopt(self, node: TreeNode, value: Slots | None, start: int) -> int:
        """An insert covers ``node`` (with ``value[start:start + len]``); returns duplicates.

        Every node of this tree holds its device slots, so all its positions are duplicates.
        """
        return len(node.key)

    def _on_hit(self, node: TreeNode, tick: int, priority: int | None = None) -> None:
        """Record a match or insert reaching ``node`` (recency, hit count, priority)."""
        member = self._evictable.discard(node)
        node.last_access_time = tick
        node.hit_count += 1
        if priority is not None and priority > node.priority:
            node.priority = priority
        if member:
            self._evictable.add(node)

    def _is_evictable_leaf(self, node: TreeNode) -> bool:
        return node.lock_ref == 0 and node.slots is not None and not node.children

    def _sync(self, node: TreeNode) -> None:
        """Put ``node`` in or out of the evictable set after its state changed."""
        if node is not self.root:
            self._evictable.put(node, self._is_evictable_leaf(node))

    def _evict_leaf(self, node: TreeNode, freed: list[Slots]) -> int:
        """Evict a leaf popped from the evictable set; its slots go to ``freed``."""
        assert node.slots is not None
        freed.append(node.slots)
        size = len(node.key)
        self._evictable_size -= size
        self._delete_leaf(node)
        return size

    def _delete_leaf(self, node: TreeNode) -> None:
        parent = node.parent
        assert parent is not None and not node.children, "only attached leaves are deleted"
        del parent.children[node.child_key]
        node.parent = None
        self._sync(parent)

    def _free_device(self, slots: list[Slots]) -> None:
        if self.token_to_kv_pool_allocator is None or not slots:
            return
        merged = concat_slots(slots, self.device)
        if merged.numel():
            self.token_to_kv_pool_allocator.free(merged)
            self.slot_owners.release(merged)

    def _device_len(self, node: TreeNode) -> int:
        return 0 if node.slots is None else len(node.key)

    def _path_to_root(self, node: TreeNode) -> list[TreeNode]:
        """``node`` and its ancestors below the root; ``ValueError`` if not in this tree."""
        if not isinstance(node, TreeNode):
            raise TypeError(f"node must be a TreeNode, got {type(node).__name__}")
        path, current = [], node
        while current is not self.root:
            if current.parent is None:
                raise ValueError(f"node {node.id} is not in this tree")
            path.append(current)
            current = current.parent
        return path

    def _no_indices(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64, device=self.device)
