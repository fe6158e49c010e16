"""Transfers of a HiRadixCache: when nodes are backed up, loaded back, and unlocked on acks.

Lock protocol: a node whose backup is queued or in flight (``cache._writing``), and the last
node of a load-back (``cache._loading``), hold one lock (``inc_lock_ref``) until the ack of their
batch is popped here; the lock covers their ancestors, so no copy ever reads or writes device
slots that were evicted and reused. A backup is queued only for a node whose parent is the root
or backed up, so backed-up nodes stay root-connected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hicache.controller import pop_finished_acks
from hicache.radix.invariants import iter_nodes
from hicache.radix.node import TreeNode
from hicache.radix.slots import concat_slots, copy_slots

if TYPE_CHECKING:
    from hicache.radix.hiradix_cache import HiRadixCache

_CPU = torch.device("cpu")


def backup(cache: HiRadixCache, node: TreeNode) -> bool:
    """Queue a backup of device node ``node`` and lock it until the ack.

    When the host pool is short, host-only leaves are evicted to make room; False (nothing
    changed but those evictions) when that is not enough or the host pool still refuses.
    """
    assert node.slots is not None and node.host_slots is None, "backup of a wrong node"
    ctrl, n = cache.cache_controller, len(node.key)
    device = node.value  # a tensor view of the node's slots
    host = ctrl.write(device, node.id)
    short = n - ctrl.mem_pool_host.available_size()
    if host is None and short > 0 and cache.evict_host(short) >= short:
        host = ctrl.write(device, node.id)
    if host is None:
        return False
    node.host_value = host  # a fresh tensor from the host pool: stored without another copy
    cache._host_size += n
    cache.inc_lock_ref(node)
    cache._writing[node.id] = node
    return True


def backup_path(cache: HiRadixCache, last: TreeNode) -> None:
    """Queue backups of the device nodes from the root to ``last`` that the write policy asks
    for (hit count reached), parents first; stop at the first the host cannot take.

    A path with a node to back up has no host-only node (a host-only node's ancestors are all
    backed up), so the ``evict_host`` a backup may run cannot delete part of it.
    """
    hits = cache.hi_config.backup_hits
    path = [] if hits is None else cache._path_to_root(last)[::-1]
    for node in path:
        if node.backuped:
            continue
        if node.slots is None or node.hit_count < hits or not backup(cache, node):
            return


def write_back(cache: HiRadixCache, node: TreeNode) -> bool:
    """Under ``write_back``, queue backups of a leaf being evicted without a host copy and of
    its ancestors lacking one (parents first). False when that does not apply or the host
    cannot take them all even after ``evict_host`` (the caller then deletes the leaf); then
    nothing is queued, unless the host pool refused an allocation it had room for: the part
    already queued stays locked until a later call issues its writes."""
    if node.backuped or cache.write_policy != "write_back":
        return False
    chain = [n for n in cache._path_to_root(node) if not n.backuped]
    short = sum(len(n.key) for n in chain) - cache.cache_controller.mem_pool_host.available_size()
    if short > 0 and cache.evict_host(short) < short:
        return False
    return all(backup(cache, n) for n in reversed(chain))


def issue_writes(cache: HiRadixCache) -> None:
    """Issue the queued writes as one batch, then pop finished acks (never blocks)."""
    cache.cache_controller.start_writing()
    pop_acks(cache)


def finish_writes(cache: HiRadixCache) -> None:
    """Issue the queued writes and block until every issued write has landed; unlock them."""
    ctrl = cache.cache_controller
    ctrl.start_writing()
    for ack in ctrl.ack_write_queue:
        ack.finish_event.synchronize()
    pop_acks(cache)


def pop_acks(cache: HiRadixCache) -> None:
    """Pop the finished write and load acks (``query()``, no wait) and unlock their nodes."""
    ctrl = cache.cache_controller
    for queue, waiting in (
        (ctrl.ack_write_queue, cache._writing),
        (ctrl.ack_load_queue, cache._loading),
    ):
        for ack in pop_finished_acks(queue):
            for node_id in ack.node_ids:
                node = waiting.pop(node_id, None)
                if node is not None:
                    cache.dec_lock_ref(node)


def host_chain(cache: HiRadixCache, node: TreeNode) -> list[TreeNode]:
    """The host-only nodes from below the deepest device node down to ``node``.

    ``TypeError``/``ValueError`` unless ``node`` is in the tree and backed up (or the root).
    """
    path = cache._path_to_root(node)
    if node is not cache.root and not node.backuped:
        raise ValueError(f"init_load_back: node {node.id} is not backed up to the host")
    return [n for n in reversed(path) if n.slots is None]


def load_chain(cache: HiRadixCache, chain: list[TreeNode]) -> torch.Tensor | None:
    """Evict device memory if needed, queue the load of ``chain`` and give its nodes their
    device slots; the last node stays locked until the load ack. None (nothing changed but
    evictions) when the device cannot make room."""
    last = chain[-1]
    need = sum(len(node.key) for node in chain)
    cache._lock(last)  # the chain and the nodes above it stay put while we evict
    try:
        short = need - cache.token_to_kv_pool_allocator.available_size()
        if short > 0:
            cache.evict(short)
        host = concat_slots([node.host_slots for node in chain], _CPU)
        device = cache.cache_controller.load(host, last.id)
    except BaseException:
        cache.dec_lock_ref(last)
        raise
    if device is None:
        cache.dec_lock_ref(last)
        return None
    offset = 0
    for node in chain:
        cache._set_device(node, copy_slots(device, offset, offset + len(node.key)))
        offset += len(node.key)
    cache._loading[last.id] = last  # keeps the lock taken above until the ack
    return device


def check_no_request_locks(cache: HiRadixCache) -> None:
    """``ValueError`` when a node holds a lock other than a pending transfer's (``reset``)."""
    transfer_locks: dict[int, int] = {}
    for node in [*cache._writing.values(), *cache._loading.values()]:
        for n in cache._path_to_root(node):
            transfer_locks[n.id] = transfer_locks.get(n.id, 0) + 1
    for node in iter_nodes(cache):
        if node.lock_ref > transfer_locks.get(node.id, 0):
            raise ValueError(
                f"reset: node {node.id} is locked by a live request; finish or release it first"
            )
