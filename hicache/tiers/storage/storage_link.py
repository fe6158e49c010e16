"""StorageLink: the storage tier's link of a HiRadixCache's chain of tiers, below the
``HostLink``: SGLang's storage calls answered by the ``StorageTier`` (contracts in
``radix.base.BasePrefixCache``). Without a storage tier, ``NoLowerTier`` takes its place."""

from __future__ import annotations

from typing import Any

from hicache.radix.device_only import check_prefill
from hicache.radix.node import TreeNode
from hicache.tiers.storage.storage_tier import StorageTier


class StorageLink:
    """Forwards to ``tier``; a ``radix.tier.StorageChain``."""

    def __init__(self, tier: StorageTier) -> None:
        self.tier = tier

    def prefetch_from_storage(
        self, req_id: str, last_host_node: TreeNode, new_input_tokens: Any
    ) -> bool:
        return self.tier.prefetch(req_id, last_host_node, new_input_tokens)

    def check_prefetch_progress(self, req_id: str) -> bool:
        return self.tier.progress(req_id)

    def pop_prefetch_loaded_tokens(self, req_id: str) -> int:
        return self.tier.pop_loaded(req_id)

    def release_aborted_request(self, req_id: str) -> None:
        self.tier.abort(req_id)

    def note_prefill(self, tokens: int, seconds: float) -> None:
        check_prefill(tokens, seconds)
        self.tier.cost.note_prefill(tokens, seconds)

    def check_hicache_events(self) -> None:
        self.tier.step()

    def drain_transfers(self) -> None:
        """Every storage write and prefetch step queued."""
        self.tier.settle()
