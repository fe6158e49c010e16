"""HostLink: the host tier's link of a HiRadixCache's chain of tiers (``radix.tier.TierChain``).

It answers the cache's host calls (load-back, load batches, host eviction, the per-step poll and
the drain) with the ``HostTier`` and the controller, and forwards the storage calls to the link
below it: a ``StorageLink``, or ``NoLowerTier`` without a storage tier. Contracts in
``radix.base.BasePrefixCache``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hicache.checks import check_int
from hicache.controller import HiCacheController
from hicache.pools import SlotAllocator
from hicache.radix.ledger import Ledger
from hicache.radix.node import TreeNode
from hicache.radix.tier import StorageChain
from hicache.tiers.host import two_tier, verified_load
from hicache.tiers.host.host_tier import HostTier
from hicache.tp import TPGroup


class HostLink:
    """The host tier's answers; ``below`` answers the storage calls.

    Parameters
    ----------
    ledger, host_tier, controller, allocator : the cache's device accounting, host tier,
        ``HiCacheController`` and device slot allocator.
    load_back_threshold : ``HiCacheConfig.load_back_threshold``.
    tp, digest : the cache's TP group and ``tree_digest`` (compared each step under
        ``tp.debug``).
    below : the storage link.
    """

    def __init__(
        self,
        ledger: Ledger,
        host_tier: HostTier,
        controller: HiCacheController,
        allocator: SlotAllocator,
        load_back_threshold: int,
        tp: TPGroup,
        digest: Callable[[], bytes],
        below: StorageChain,
    ) -> None:
        self.ledger, self.host_tier, self.controller = ledger, host_tier, controller
        self.allocator, self.load_back_threshold = allocator, load_back_threshold
        self.tp, self.digest, self.below = tp, digest, below
        # the tier's own call, bound: no forwarding frame on every prefill step
        self.ready_to_load_host_cache: Callable[[], int] = host_tier.issue_loads

    def init_load_back(
        self, last_host_node: TreeNode, host_hit_length: int, mem_quota: int | None
    ) -> tuple[torch.Tensor, TreeNode]:
        """Loads the whole host-only chain ending at ``last_host_node``. A load-back that
        ``verify`` selects is issued and checked here (blocking); a corrupt page and
        everything after it are not returned (``verified_load``)."""
        chain = self.host_tier.chain(last_host_node)
        if type(host_hit_length) is not int or host_hit_length < 0:
            check_int("host_hit_length", host_hit_length, minimum=0)
        if mem_quota is not None:
            check_int("mem_quota", mem_quota, minimum=0)
        above = chain[0].parent if chain else last_host_node
        assert above is not None
        need = 0  # the chain's tokens
        for node in chain:
            need += len(node.key)
        device = None
        fits = mem_quota is None or need <= mem_quota
        if chain and fits and host_hit_length >= self.load_back_threshold:
            device = two_tier.queue_load(self.ledger, self.host_tier, self.allocator, chain, need)
        if device is None:
            return torch.empty(0, dtype=torch.int64, device=self.ledger.device), above
        if self.controller.integrity is None:  # verify="off": nothing to check
            return device, chain[-1]
        return verified_load.check_load(self.host_tier, chain, device)

    def consume_load_batch(self, index: int) -> None:
        self.controller.layer_done_counter.set_consumer(index)

    def check_hicache_events(self) -> None:
        """The host step, then the storage link's; under TP the one agreement point of a
        scheduler step for finished transfers (and, with ``tp.debug``, the tree digests).
        An idle host tier skips its step: with nothing in flight that issues no collective."""
        if not self.host_tier.idle():
            self.host_tier.step()
        self.below.check_hicache_events()
        if self.tp.debug:
            self.tp.check_digest(self.digest(), where="check_hicache_events")

    def drain_transfers(self) -> None:
        """The host drain, then the storage link's (the host writes landing queue storage
        writes)."""
        self.host_tier.drain()
        self.below.drain_transfers()

    def host_size(self) -> int:
        return self.host_tier.size()

    def evict_host(self, num_tokens: int) -> int:
        """Deletes host-only leaves in policy order."""
        check_int("num_tokens", num_tokens, minimum=0)
        return self.host_tier.evict(num_tokens)

    def prefetch_from_storage(
        self, req_id: str, last_host_node: TreeNode, new_input_tokens: Any
    ) -> bool:
        return self.below.prefetch_from_storage(req_id, last_host_node, new_input_tokens)

    def check_prefetch_progress(self, req_id: str) -> bool:
        return self.below.check_prefetch_progress(req_id)

    def pop_prefetch_loaded_tokens(self, req_id: str) -> int:
        return self.below.pop_prefetch_loaded_tokens(req_id)

    def release_aborted_request(self, req_id: str) -> None:
        self.below.release_aborted_request(req_id)

    def note_prefill(self, tokens: int, seconds: float) -> None:
        self.below.note_prefill(tokens, seconds)
