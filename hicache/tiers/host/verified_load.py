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
nodes above that node; under exclusive tiering they shed their host copies at once) and
recomputes the rest; the load's transfer lock is released at once (the load has landed:
``HostTier.cancel_load``). ``failures`` on the controller's
``integrity`` counts the bad pages.

Under TP each rank checks its own shard and the ranks keep the shortest verified prefix, so a
page corrupt on one rank is dropped on every rank.

Not covered: a load batch whose issue raised stays queued (as for any load) and is issued later
by ``ready_to_load_host_cache`` without a check.
"""

from __future__ import annotations

import torch

from hicache.radix.node import TreeNode
from hicache.radix.slots import concat_slots
from hicache.tiers.host.host_tier import HostTier

_CPU = torch.device("cpu")


def check_load(
    tier: HostTier, chain: list[TreeNode], device: torch.Tensor
) -> tuple[torch.Tensor, TreeNode]:
    """``init_load_back``'s result for ``chain`` just queued by ``tier.load`` into ``device``:
    ``(device, chain[-1])`` unless a verified page differs from its backup, then the verified
    prefix and its last node (``chain[0].parent`` and no slots when nothing is left)."""
    ctrl = tier.controller
    if ctrl.integrity is None or not ctrl.integrity.select():
        return device, chain[-1]
    total, failed, mine = device.numel(), None, None
    try:
        ctrl.start_loading()
        host = concat_slots([n.host_slots for n in chain if n.host_slots is not None], _CPU)
        mine = ctrl.verify_load(host, device)
    except Exception as exc:  # re-raised by the agreement (at once on one rank)
        failed = exc
    where = "verified load-back"
    (bad,), _ = tier.tp.agree([total if mine is None else mine], where=where, failed=failed)
    if bad >= total:
        return device, chain[-1]
    first, start = 0, 0  # the node holding token ``bad``, and its offset
    while start + len(chain[first].key) <= bad:
        start += len(chain[first].key)
        first += 1
    above = chain[first].parent
    assert above is not None
    tier.cancel_load(chain[-1])  # the load has landed
    tier.drop_subtree(chain[first])
    tier.shed(chain[:first])  # exclusive tiering: the verified prefix has moved up
    return device[:start], above
