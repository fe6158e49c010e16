"""Verified load-back of a HiRadixCache (``verify="sample"``/``"all"``): a corrupt page is never
served.

With layer-wise loading the forward pass may consume a layer as soon as it lands, so a check read
later could not stop it. A load-back chosen for verification (``PageIntegrity.select``) is
therefore issued and checked inside ``init_load_back``, before its device slots are handed out:
``start_loading`` issues it at once (with any loads already queued), ``verify_load`` checksums the
loaded device pages on the load stream and blocks for the result. ``ready_to_load_host_cache``
then has nothing to issue for it (the data has landed; no wait is needed).

On a mismatch the node holding the first bad page is dropped with its whole subtree: its device
slots and those of the chain below it go back to the allocator, its host copy and its
descendants' (all host-only) to the host pool. The caller gets the verified prefix (the chain's
nodes above that node) and recomputes the rest; the load's transfer lock is released at once
(the load has landed). ``failures`` on the controller's ``integrity`` counts the bad pages.

Not covered: a load batch whose issue raised stays queued (as for any load) and is issued later
by ``ready_to_load_host_cache`` without a check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hicache.radix.node import TreeNode
from hicache.radix.slots import Slots, concat_slots

if TYPE_CHECKING:
    from hicache.radix.hiradix_cache import HiRadixCache

_CPU = torch.device("cpu")


def check_load(
    cache: HiRadixCache, chain: list[TreeNode], device: torch.Tensor
) -> tuple[torch.Tensor, TreeNode]:
    """``init_load_back``'s result for ``chain`` just queued by ``host_io.load_chain`` into
    ``device``: ``(device, chain[-1])`` unless a verified page differs from its backup, then the
    verified prefix and its last node (``chain[0].parent`` and no slots when nothing is left)."""
    ctrl = cache.cache_controller
    if ctrl.integrity is None or not ctrl.integrity.select():
        return device, chain[-1]
    ctrl.start_loading()
    host = concat_slots([node.host_slots for node in chain], _CPU)
    bad = ctrl.verify_load(host, device)
    if bad is None:
        return device, chain[-1]
    first, start = 0, 0  # the node holding token ``bad``, and its offset
    while start + len(chain[first].key) <= bad:
        start += len(chain[first].key)
        first += 1
    last, above = chain[-1], chain[first].parent
    assert above is not None
    del cache._loading[last.id]  # the load has landed; its ack, popped later, finds no node
    cache.dec_lock_ref(last)
    drop_subtree(cache, chain[first])
    return device[:start], above


def drop_subtree(cache: HiRadixCache, top: TreeNode) -> None:
    """Delete ``top`` and its descendants from the tree, freeing their device and host slots.

    They must be unlocked, with no transfer pending (a host-only node's descendants are host-only).
    """
    nodes, stack = [], [top]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())
    device: list[Slots] = []
    host: list[Slots] = []
    for node in reversed(nodes):  # every node after its descendants: a leaf when deleted
        assert node.lock_ref == 0 and node.host_slots is not None, "dropping a wrong node"
        host.append(node.host_slots)
        node.host_slots = None
        cache._host_size -= len(node.key)
        if node.slots is not None:
            device.append(node.slots)
            cache._set_device(node, None)  # also files it out of both leaf sets
        else:
            cache._sync(node)
        cache._delete_leaf(node)
    cache._free_device(device)
    cache.cache_controller.evict_host(concat_slots(host, _CPU))
