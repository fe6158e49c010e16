"""Incremental checks after each stress op: find what the op changed, check only that.

A :class:`Tracker` keeps a shadow of slot ownership (which tree node or live request owns each
device and host slot) and the header of every tree node (its key, slots and host slots by
identity, its parent and its lock count). After an op one Python pass over the node headers
finds the nodes the op created, changed or removed (no tensor work); only those are checked:

- ownership: a slot a node or request takes must be unowned and not free; a slot given up must
  be free now or taken by another owner; on both tiers owned + ``available_size()`` == pool
  size, and the tree's ``evictable_size() + protected_size()`` and ``host_size()`` equal the
  slots its nodes hold; request rows in use match the live requests;
- structure: slots are int64 ``[len(key)]``, the node is its parent's child, shares its
  ``extra_key``, and is on the device (backed up) only if its parent is;
- locks, on the touched nodes and their parents: ``lock_ref`` == the locks taken on the node
  itself (requests, the driver, queued or unacked transfers) + its children's ``lock_ref``; a
  locked node is on the device;
- bytes: a node's new device or host copy holds the oracle's KV (one still queued for transfer
  is checked once it has landed).

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
from hicache.stress.oracle import device_kv, host_kv, mismatches
from hicache.stress.workload import SALTS

FREE, RESERVED = -1, -2  # owner tags: nodes are tagged by id, live request k by -3 - k
TIERS = ("device", "host")
_INT64 = (np.dtype(np.int64), torch.int64)


def _array(slots: Any) -> np.ndarray:
    """A node's stored slots (numpy, or a tensor on their device) as a CPU numpy array."""
    return slots if isinstance(slots, np.ndarray) else slots.cpu().numpy()


def _offset(node: Any, root: Any) -> int:
    """Position of the node's first token in its sequence."""
    offset, node = 0, node.parent
    while node is not None and node is not root:
        offset, node = offset + len(node.key), node.parent
    return offset


def transfer_locks(controller: Any) -> Counter[int]:
    """Node id -> locks its queued or unacknowledged transfers hold (one per operation)."""
    held: Counter[int] = Counter()
    for queue in (controller.write_queue, controller.load_queue, controller.ack_write_queue,
                  controller.ack_load_queue):
        for item in queue:
            held.update(item.node_ids)
    return held


class Tracker:
    """Shadow ownership and node headers of one cache; :meth:`check` after every op.

    Parameters
    ----------
    cache : the HiRadixCache under test; allocator, host_pool, req_pool : its pools.
    all_device, all_host : every slot each tier can hand out (int64 CPU).
    """

    def __init__(self, cache: Any, allocator: Any, host_pool: Any, req_pool: Any,
                 all_device: torch.Tensor, all_host: torch.Tensor) -> None:
        self.cache, self.req_pool = cache, req_pool
        self.pools = {"device": allocator, "host": host_pool}
        self.all = {"device": all_device.numpy(), "host": all_host.numpy()}
        self.bound = {t: int(self.all[t].max()) + 1 for t in TIERS}
        self.rows = req_pool.available_size()
        self.reset()

    def reset(self) -> None:
        """Forget everything: the next :meth:`check` treats every node as new."""
        self.owner = {t: np.full(self.bound[t], RESERVED, np.int64) for t in TIERS}
        for tier in TIERS:
            self.owner[tier][self.all[tier]] = FREE
        self.held = {t: 0 for t in TIERS}  # slots owned, every owner
        self.in_tree = {t: 0 for t in TIERS}  # slots owned by tree nodes
        self.seen: dict[int, tuple[int, ...]] = {}  # node id -> header (see ``_header``)
        self.alive: dict[int, tuple[Any, ...]] = {}  # what the header's ids name, kept alive
        self.claims: dict[str, dict[int, np.ndarray]] = {t: {} for t in TIERS}  # tag -> slots
        self.deferred: dict[int, tuple[Any, str]] = {}  # node id -> (node, tier) still in flight
        self.locks: Counter[int] = Counter()
        self.requests: list[tuple[int, int]] = []  # (data_ptr, numel) of each request's slots
        self.request_slots: list[torch.Tensor] = []

    # ---- the check ---------------------------------------------------------------------------

    def check(self, requests: list[torch.Tensor], locks: Counter[int], verify: bool = True
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
        gone = [i for i in self.seen if i not in nodes]
        locks = locks + transfer_locks(self.cache.cache_controller)
        lock_ids = set(self.locks) | set(locks)
        touched = {i for i in lock_ids if self.locks[i] != locks[i]}
        self.locks = locks
        bad, moved = self._ownership(changed, gone, requests)
        for node in changed:
            self.seen[node.id] = _header(node)
            self.alive[node.id] = (node.key, node.slots, node.host_slots, node.parent)
            touched.add(node.id)
            touched.update(c.id for c in node.children.values())
            touched.add(node.parent.id if node.parent is not None else -1)
        for i in gone:
            del self.seen[i]
            touched.add(self.alive.pop(i)[3].id)
        for i in touched & nodes.keys():
            bad += self._structure(nodes[i], root) + self._lock(nodes[i], locks)
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
            if seen.get(node.id) != (id(node.key), id(node.slots), id(node.host_slots),
                                     id(node.parent), node.lock_ref):  # ``_header`` inlined
                changed.append(node)
            stack.extend(node.children.values())
        return nodes, changed

    # ---- ownership ---------------------------------------------------------------------------

    def _ownership(self, changed: list[Any], gone: list[int], requests: list[torch.Tensor]
                   ) -> tuple[list[str], list[tuple[Any, str]]]:
        """Release what changed hands, claim what was taken; (violations, (node, tier) whose
        copy is new)."""
        released = {t: [self._release(i, t) for i in gone] for t in TIERS}
        moved: list[tuple[Any, str]] = []
        for node in changed:
            old = self.seen.get(node.id)
            for k, tier in enumerate(TIERS):
                if old is None or old[1 + k] != id(_slots(node, tier)):
                    released[tier].append(self._release(node.id, tier))
                    moved.append((node, tier))
        requests_now = [(t.data_ptr(), t.numel()) for t in requests]
        if requests_now != self.requests:  # a request took or gave up slots
            self.requests, self.request_slots = requests_now, requests  # kept: ptrs not reused
            released["device"] += [self._release(tag, "device")
                                   for tag in [t for t in self.claims["device"] if t < 0]]
        else:
            requests = []
        bad: list[str] = []
        taken: dict[str, list[np.ndarray]] = {t: [] for t in TIERS}
        for node, tier in moved:
            slots = _slots(node, tier)
            if slots is not None:
                bad += self._claim(node.id, tier, _array(slots), taken)
        for k, slots in enumerate(requests):
            bad += self._claim(-3 - k, "device", slots.cpu().numpy(), taken)
        for tier in TIERS:
            bad += self._against_free_list(tier, released[tier], taken[tier])
        return bad, [(node, tier) for node, tier in moved if _slots(node, tier) is not None]

    def _release(self, tag: int, tier: str) -> np.ndarray:
        slots = self.claims[tier].pop(tag, None)
        if slots is None:
            return np.empty(0, np.int64)
        self.owner[tier][slots] = FREE
        self.held[tier] -= slots.size
        self.in_tree[tier] -= slots.size if tag >= 0 else 0
        return slots

    def _claim(self, tag: int, tier: str, slots: np.ndarray, taken: dict[str, list[np.ndarray]]
               ) -> list[str]:
        who = _who(tag)
        if slots.dtype != np.int64 or slots.ndim != 1:
            return [f"{tier}: {who} holds slots of dtype {slots.dtype}, shape {slots.shape}"]
        if slots.size and (int(slots.min()) < 0 or int(slots.max()) >= self.bound[tier]):
            return [f"{tier}: {who} holds slots out of range: {slots[:8].tolist()}"]
        owners = self.owner[tier][slots]
        if bool((owners != FREE).any()):
            k = int(np.flatnonzero(owners != FREE)[0])
            return [f"{tier}: slot {int(slots[k])} is owned twice: by {who} and by "
                    f"{_who(int(owners[k]))}"]
        self.owner[tier][slots] = tag
        self.claims[tier][tag] = slots
        self.held[tier] += slots.size
        self.in_tree[tier] += slots.size if tag >= 0 else 0
        taken[tier].append(slots)
        return []

    def _against_free_list(self, tier: str, released: list[np.ndarray],
                           taken: list[np.ndarray]) -> list[str]:
        """Slots taken this op are not free; slots given up and not taken again are."""
        released = [s for s in released if s.size]
        if not (released or taken):
            return []
        free = np.zeros(self.bound[tier], bool)
        free[self.pools[tier].free_slots().numpy()] = True
        owner = self.owner[tier]
        bad = [] if np.count_nonzero((owner >= 0) | (owner < RESERVED)) == self.held[tier] else [
            f"{tier}: an owner holds one slot twice"]
        if taken and bool(free[np.concatenate(taken)].any()):
            both = [int(s) for s in np.concatenate(taken) if free[s]][:8]
            bad.append(f"{tier}: slots {both} are owned and free at once (freed while in use)")
        if released:
            gave = np.concatenate(released)
            lost = gave[(owner[gave] == FREE) & ~free[gave]]
            if lost.size:
                bad.append(f"{tier}: slots leaked (given up, neither free nor owned): "
                           f"{lost[:8].tolist()}")
        return bad

    def _counts(self, live: int) -> list[str]:
        cache, bad = self.cache, []
        for tier in TIERS:
            free = self.pools[tier].available_size()
            size, held = self.all[tier].size, self.held[tier]
            if free + held != size:
                bad.append(f"{tier}: {free} free + {held} owned != {size} slots (a slot "
                           "leaked or is counted twice)")
        sizes = (cache.evictable_size() + cache.protected_size(), cache.host_size())
        for tier, size in zip(TIERS, sizes, strict=True):
            if size != self.in_tree[tier] or tier == "device" and size != cache.total_size():
                bad.append(f"{tier}: the tree counts {size} tokens, its nodes hold "
                           f"{self.in_tree[tier]}")
        if self.req_pool.available_size() + live != self.rows:
            bad.append(f"request rows: {self.req_pool.available_size()} free with {live} live "
                       f"requests, of {self.rows}")
        return bad

    # ---- nodes -------------------------------------------------------------------------------

    def _structure(self, node: Any, root: Any) -> list[str]:
        n, page, parent = len(node.key), self.cache.page_size, node.parent
        bad = [] if n and n % page == 0 else [f"node {node.id}: key length {n} is not pages"]
        for tier in TIERS:
            s = _slots(node, tier)
            if s is not None and (s.dtype not in _INT64 or s.ndim != 1 or s.shape[0] != n):
                bad.append(f"node {node.id}: {tier} slots are not int64 [{n}]")
        if node.slots is None and node.host_slots is None:
            bad.append(f"node {node.id} holds neither device nor host slots")
        if parent is None or parent.children.get(node.child_key) is not node:
            return bad + [f"node {node.id} is not its parent's child"]
        if parent is not root:
            bad += [f"node {node.id}: {what}" for what, wrong in (
                ("extra_key differs from its parent's", node.extra_key != parent.extra_key),
                ("on the device, its parent is not", node.slots is not None
                 and parent.slots is None),
                ("backed up, its parent is not", node.host_slots is not None
                 and parent.host_slots is None)) if wrong]
        return bad

    def _lock(self, node: Any, locks: Counter[int]) -> list[str]:
        want = locks[node.id] + sum(c.lock_ref for c in node.children.values())
        bad = [] if node.lock_ref == want else [
            f"node {node.id}: lock_ref {node.lock_ref}, but {locks[node.id]} locks on it and "
            f"{want - locks[node.id]} below it are held (a lock leaked or was lost)"]
        if node.lock_ref and node.slots is None:
            bad.append(f"node {node.id} is locked but has no device copy")
        return bad

    # ---- bytes -------------------------------------------------------------------------------

    def _bytes(self, moved: list[tuple[Any, str]], nodes: dict[int, Any]) -> list[str]:
        """The oracle's KV in every new copy and in every deferred one that has landed."""
        work = {(node.id, tier): (node, tier) for node, tier in moved}
        for i, (node, tier) in list(self.deferred.items()):
            if nodes.get(i) is node and _slots(node, tier) is not None:
                work.setdefault((i, tier), (node, tier))
        self.deferred.clear()
        if not work:
            return []
        loading, writing = (x.numpy() for x in pending(self.cache.cache_controller))
        bad: list[str] = []
        for tier, skip in (("device", loading), ("host", writing)):
            ready = []
            for node, t in work.values():
                if t != tier:
                    continue
                if skip.size and np.isin(_array(_slots(node, tier)), skip).any():
                    self.deferred[node.id] = (node, tier)
                else:
                    ready.append(_rows(node, _offset(node, self.cache.root), tier))
            bad += self._compare(tier, ready)
        return bad

    def _compare(self, tier: str, todo: list[tuple[Any, ...]]) -> list[str]:
        """Read back ``(node, slots, tokens, positions, salts)`` copies in one batch; on a
        mismatch, node by node to name them."""
        if not todo:
            return []
        ctrl = self.cache.cache_controller
        dev, reader = ctrl.mem_pool_device, device_kv if tier == "device" else host_kv
        pool = dev if tier == "device" else ctrl.mem_pool_host
        read: Callable[..., torch.Tensor] = lambda layer, part, s: reader(pool, layer, part, s)  # noqa: E731
        _, *columns = zip(*todo, strict=True)
        slots, tokens, positions, salts = (np.concatenate(c) for c in columns)
        if not mismatches(dev, read, torch.from_numpy(slots), tokens, positions, salts):
            return []
        return [f"node {node.id} {tier} copy: {msg}" for node, *cols in todo
                for msg in mismatches(dev, read, torch.from_numpy(cols[0]), *cols[1:])]


def _header(node: Any) -> tuple[int, ...]:
    """A node's state: its key, slots, host slots and parent by identity, and its lock count
    (the objects are kept alive in ``Tracker.alive``, so an id is never reused meanwhile)."""
    return id(node.key), id(node.slots), id(node.host_slots), id(node.parent), node.lock_ref


def _slots(node: Any, tier: str) -> Any:
    return node.slots if tier == "device" else node.host_slots


def _rows(node: Any, offset: int, tier: str) -> tuple[Any, ...]:
    """(node, slots, tokens, positions, salts) of the node's copy on ``tier``, int64 numpy."""
    n = len(node.key)
    return (node, _array(_slots(node, tier)), node.key.astype(np.int64),
            np.arange(offset, offset + n), np.full(n, SALTS[node.extra_key]))


def _who(tag: int) -> str:
    if tag == RESERVED:
        return "the reserved slots"
    return f"node {tag}" if tag >= 0 else f"live request {-3 - tag}"
