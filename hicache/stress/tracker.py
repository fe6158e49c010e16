"""Incremental checks after each stress op: find what the op changed, check only that.

A :class:`Tracker` keeps a shadow of slot ownership (:mod:`hicache.stress.shadow`: which tree
node or live request owns each device and host slot) and the header of every tree node (its
key, slots and host slots by identity, its parent and its lock count). After an op one Python
pass over the node headers finds the nodes the op created, changed or removed (no tensor work);
only those are checked:

- ownership: a slot a node or request takes must be unowned and not free; a slot given up must
  be free now, taken by another owner or kept for a pending write (``host_tier.held``); on both
  tiers owned + kept + ``available_size()`` == pool size, and the tree's ``evictable_size() +
  protected_size()`` (== ``total_size()``) and ``host_size()`` equal the slots its nodes hold;
  request rows in use match the live requests;
- structure: slots are int64 ``[len(key)]``, the node is its parent's child, shares its
  ``extra_key``, and is on the device (inclusive: backed up) only if its parent is;
- locks, on the touched nodes, their parents and every node whose own locks changed:
  ``lock_ref`` == the locks taken on the node itself (requests, the driver, queued or unacked
  transfers) + its children's ``lock_ref``; a locked node is on the device;
- bytes: a node's new device or host copy holds the oracle's KV. Slots that only moved from
  one node to another (a split) and were verified before are compared by what they hold
  (token, position, namespace) instead of being read again; a copy still queued for transfer
  is read once it has landed.

Bytes an op writes into slots it does not own (no header changes) are caught by the full check
the driver runs at a stride, or when a request reads them. Public fields and calls only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from hicache.stress.checker import pending
from hicache.stress.node_rows import (
    TIERS,
    as_array,
    header,
    offset_of,
    rows_of,
    slots_on,
    structure,
)
from hicache.stress.oracle import device_rows, differences, expected_rows, host_rows
from hicache.stress.shadow import TierShadow


class Tracker:
    """Shadow ownership and node headers of one cache; :meth:`check` after every op.

    Parameters
    ----------
    cache : the HiRadixCache under test; allocator, host_pool, req_pool : its pools.
    all_device, all_host : every slot each tier can hand out (int64 CPU).
    host_reserved : host slots reserved outside the tree (``cache.host_tier.reserved``).
    """

    def __init__(
        self,
        cache: Any,
        allocator: Any,
        host_pool: Any,
        req_pool: Any,
        all_device: torch.Tensor,
        all_host: torch.Tensor,
        host_reserved: Callable[[], int] = int,
    ) -> None:
        self.cache, self.req_pool, self.host_reserved = cache, req_pool, host_reserved
        self.inclusive = getattr(cache, "tiering", "inclusive") == "inclusive"
        self.pools = {"device": allocator, "host": host_pool}
        self.every = {"device": all_device.numpy(), "host": all_host.numpy()}
        self.rows = req_pool.available_size()
        self.reset()

    def reset(self) -> None:
        """Forget everything: the next :meth:`check` treats every node as new."""
        reserved: dict[str, Callable[[], int]] = {
            "device": lambda: self.cache.host_tier.held().numel(),  # kept for pending writes
            "host": self.host_reserved,
        }
        self.tiers = {t: TierShadow(t, self.pools[t], self.every[t], reserved[t]) for t in TIERS}
        self.seen: dict[int, tuple[Any, ...]] = {}  # node id -> header (see ``node_rows.header``)
        self.alive: dict[int, tuple[Any, ...]] = {}  # what the header's ids name, kept alive
        self.deferred: dict[tuple[int, str], Any] = {}  # (node id, tier) -> node, in flight
        self.locks: Counter[int] = Counter()
        self.requests: list[tuple[int, int]] = []  # (data_ptr, numel) of each request's slots
        self.request_slots: list[torch.Tensor] = []  # kept alive: the pointers are not reused

    def check(
        self, requests: list[torch.Tensor], locks: Counter[int], verify: bool = True
    ) -> list[str]:
        """Check what changed since the last call.

        Parameters
        ----------
        requests : the device slots each live request owns (int64, any device).
        locks : node id -> locks the driver holds on that node itself (requests and its own).
        verify : also check the bytes of new copies (off when re-basing after a full check).
        """
        root = self.cache.root
        nodes, changed = self._walk(root)
        new = sum(node.id not in self.seen for node in changed)
        gone = (
            [] if len(self.seen) + new == len(nodes) else [i for i in self.seen if i not in nodes]
        )
        locks.update(self.cache.host_tier.transfer_locks())  # pending transfers lock their nodes
        touched = (
            set()
            if locks == self.locks
            else {i for i in locks.keys() | self.locks.keys() if locks[i] != self.locks[i]}
        )
        self.locks = locks
        moved = self._moves(changed, gone)
        bad = self._take(moved, requests)
        for node in changed:
            self.seen[node.id] = header(node)
            self.alive[node.id] = (node.key, node.slots, node.host_slots)
            touched.add(node.id)
            touched.update(c.id for c in node.children.values())
            touched.add(node.parent.id if node.parent is not None else -1)
        for i in gone:
            del self.alive[i]
            touched.add(self.seen.pop(i)[3].id)
        for i in touched & nodes.keys():
            bad += structure(nodes[i], root, self.cache.page_size, self.inclusive)
            bad += self._lock(nodes[i], locks)
        bad += self._counts(len(requests))
        if verify:
            bad += self._bytes(moved, nodes)
        return bad

    def _walk(self, root: Any) -> tuple[dict[int, Any], list[Any]]:
        """(every node below ``root`` by id, those whose header changed): one Python pass."""
        nodes, changed, seen, stack = {}, [], self.seen, list(root.children.values())
        while stack:
            node = stack.pop()
            nodes[node.id] = node
            if seen.get(node.id) != (
                id(node.key),
                id(node.slots),
                id(node.host_slots),
                node.parent,
                node.lock_ref,
            ):  # ``header`` inlined
                changed.append(node)
            stack.extend(node.children.values())
        return nodes, changed

    # ---- ownership ---------------------------------------------------------------------------

    def _moves(self, changed: list[Any], gone: list[int]) -> list[tuple[Any, str]]:
        """Release the slots of removed nodes and of changed copies; the changed copies."""
        for i in gone:
            for shadow in self.tiers.values():
                shadow.release(i)
        moved = []
        for node in changed:
            old = self.seen.get(node.id)
            for k, tier in enumerate(TIERS):
                if old is None or old[1 + k] != id(slots_on(node, tier)):
                    self.tiers[tier].release(node.id)
                    moved.append((node, tier))
        return moved

    def _take(self, moved: list[tuple[Any, str]], requests: list[torch.Tensor]) -> list[str]:
        """Claim the moved copies' slots and (when they changed) the requests'; settle."""
        device, bad = self.tiers["device"], []
        now = [(t.data_ptr(), t.numel()) for t in requests]
        renew = now != self.requests  # a request took or gave up slots
        if renew:
            self.requests, self.request_slots = now, requests
            for tag in [t for t in device.claims if t < 0]:
                device.release(tag)
        for node, tier in moved:
            slots = slots_on(node, tier)
            if slots is not None:
                bad += self.tiers[tier].claim(node.id, as_array(slots))
        for k, slots in enumerate(requests if renew else []):
            bad += device.claim(-3 - k, slots.cpu().numpy())
        for shadow in self.tiers.values():
            bad += shadow.settle()
        return bad

    def _counts(self, live: int) -> list[str]:
        cache = self.cache
        bad = [msg for shadow in self.tiers.values() for msg in shadow.count()]
        device = cache.evictable_size() + cache.protected_size()
        for tier, size in (("device", device), ("host", cache.host_size())):
            if size != self.tiers[tier].in_tree or tier == "device" and size != cache.total_size():
                bad.append(
                    f"{tier}: the tree counts {size} tokens, its nodes hold "
                    f"{self.tiers[tier].in_tree}"
                )
        if self.req_pool.available_size() + live != self.rows:
            bad.append(
                f"request rows: {self.req_pool.available_size()} free with {live} live "
                f"requests, of {self.rows}"
            )
        return bad

    # ---- nodes -------------------------------------------------------------------------------

    def _lock(self, node: Any, locks: Counter[int]) -> list[str]:
        want = locks[node.id] + sum(c.lock_ref for c in node.children.values())
        bad = (
            []
            if node.lock_ref == want
            else [
                f"node {node.id}: lock_ref {node.lock_ref}, but {locks[node.id]} locks on it and "
                f"{want - locks[node.id]} below it are held (a lock leaked or was lost)"
            ]
        )
        if node.lock_ref and node.slots is None:
            bad.append(f"node {node.id} is locked but has no device copy")
        return bad

    # ---- bytes -------------------------------------------------------------------------------

    def _bytes(self, moved: list[tuple[Any, str]], nodes: dict[int, Any]) -> list[str]:
        """The oracle's KV in every new copy and in every deferred one that has landed."""
        work = {(node.id, tier): node for node, tier in moved if slots_on(node, tier) is not None}
        for (i, tier), node in self.deferred.items():
            if nodes.get(i) is node and slots_on(node, tier) is not None:
                work.setdefault((i, tier), node)
        self.deferred = {}
        if not work:
            return []
        in_flight = {
            t: self.tiers[t].mask(x.numpy()) if x.numel() else None
            for t, x in zip(TIERS, pending(self.cache.cache_controller), strict=True)
        }
        todo: list[tuple[Any, ...]] = []
        for (i, tier), node in sorted(work.items(), key=lambda item: item[0][1]):  # by tier
            rows = rows_of(node, offset_of(node, self.cache.root), tier)
            flying = in_flight[tier]
            if flying is not None and flying[rows[2]].any():
                self.deferred[(i, tier)] = node
            elif (self.tiers[tier].content[rows[2]] != rows[6]).any():
                todo.append(rows)
        return self._compare(todo)

    def _compare(self, todo: list[tuple[Any, ...]]) -> list[str]:
        """Read back ``(tier, node, slots, tokens, positions, salts, packed)`` copies (sorted by
        tier): one oracle lookup, one batch per tier; remember what verified; on a mismatch,
        node by node to name them."""
        if not todo:
            return []
        dev = self.cache.cache_controller.mem_pool_device
        tiers, _, *columns = zip(*todo, strict=True)
        slots, tokens, positions, salts, packed = (
            c[0] if len(c) == 1 else np.concatenate(c) for c in columns
        )
        want = expected_rows(dev, tokens, positions, salts)
        sizes = np.cumsum([0] + [len(c) for c in columns[0]])
        bad: list[str] = []
        for tier in dict.fromkeys(tiers):
            lo, hi = sizes[tiers.index(tier)], sizes[len(tiers) - tiers[::-1].index(tier)]
            read = self._reader(tier)
            s = torch.from_numpy(slots[lo:hi])
            if not differences(dev, read(s), want[lo:hi], s):
                self.tiers[tier].content[slots[lo:hi]] = packed[lo:hi]
                continue
            for t, node, slot, *cols in todo:
                s = torch.from_numpy(slot)
                bad += (
                    [
                        f"node {node.id} {tier} copy: {msg}"
                        for msg in differences(dev, read(s), expected_rows(dev, *cols[:3]), s)
                    ]
                    if t == tier
                    else []
                )
        return bad

    def _reader(self, tier: str) -> Callable[[torch.Tensor], torch.Tensor]:
        ctrl = self.cache.cache_controller
        if tier == "device":
            return lambda s: device_rows(ctrl.mem_pool_device, s)
        return lambda s: host_rows(ctrl.mem_pool_host, s)
