"""The storage hooks of a HiRadixCache: the ``BasePrefixCache`` storage calls, answered by its
``StorageTier`` when it has one and by the device-only no-ops (``NoLowerTier``) otherwise."""

from __future__ import annotations

from typing import Any

from hicache.radix.device_only import NoLowerTier, check_prefill
from hicache.radix.host_tier import HostTier
from hicache.radix.node import TreeNode
from hicache.radix.storage_tier import StorageTier


class StorageHooks(NoLowerTier):
    """Mixed into ``HiRadixCache``; reads only ``storage_tier``."""

    storage_tier: StorageTier | None
    host_tier: HostTier

    def prefetch_from_storage(
        self,
        req_id: str,
        last_host_node: TreeNode,
        new_input_tokens: Any,
        last_hash: bytes | None = None,
    ) -> bool:
        """Contract in ``BasePrefixCache``; ``last_hash`` is ignored (the tree has the hashes)."""
        if self.storage_tier is None:
            return super().prefetch_from_storage(req_id, last_host_node, new_input_tokens)
        return self.storage_tier.prefetch(req_id, last_host_node, new_input_tokens)

    def check_prefetch_progress(self, req_id: str) -> bool:
        if self.storage_tier is None:
            return super().check_prefetch_progress(req_id)
        return self.storage_tier.progress(req_id)

    def pop_prefetch_loaded_tokens(self, req_id: str) -> int:
        if self.storage_tier is None:
            return super().pop_prefetch_loaded_tokens(req_id)
        return self.storage_tier.pop_loaded(req_id)

    def release_aborted_request(self, req_id: str) -> None:
        if self.storage_tier is None:
            super().release_aborted_request(req_id)
        else:
            self.storage_tier.abort(req_id)

    def note_prefill(self, tokens: int, seconds: float) -> None:
        check_prefill(tokens, seconds)
        if self.storage_tier is not None:
            self.storage_tier.cost.note_prefill(tokens, seconds)

    def close(self) -> None:
        """Stop the storage tier's threads and close its backend (idempotent); the cache
        keeps serving from the device and host tiers."""
        if self.storage_tier is not None:
            self.storage_tier.close()
            self.host_tier.below = None
            self.storage_tier = None
