"""The null link of the tier chain: the answers of a cache with no tier below the device.

``RadixCache``'s whole chain (``tier.TierChain``), and the storage link of a ``HiRadixCache``
without storage. The contract is in ``base.BasePrefixCache``: nothing is ever on the host, so a
load-back loads nothing, there is no load batch to consume, no transfer to drain, no host token
to evict and nothing to prefetch. Arguments are still validated, so a caller written against
``HiRadixCache`` gets the same errors.
"""

from __future__ import annotations

from typing import Any

import torch

from hicache.checks import check_int
from hicache.radix.node import TreeNode
from hicache.radix.tree import RadixTree


class NoLowerTier:
    """No tier below: validates against ``tree``; empty results on ``device``."""

    def __init__(self, tree: RadixTree, device: torch.device) -> None:
        self.tree, self.device = tree, device

    def init_load_back(
        self, last_host_node: TreeNode, host_hit_length: int, mem_quota: int | None = None
    ) -> tuple[torch.Tensor, TreeNode]:
        """Nothing is ever on the host: validates, then ``(empty, last_host_node)``."""
        self.tree.path_to_root(last_host_node)
        check_int("host_hit_length", host_hit_length, minimum=0)
        if mem_quota is not None:
            check_int("mem_quota", mem_quota, minimum=0)
        return torch.empty(0, dtype=torch.int64, device=self.device), last_host_node

    def ready_to_load_host_cache(self) -> int:
        return -1

    def consume_load_batch(self, index: int) -> None:
        """Only -1 (no load batch) is valid here."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"index must be an int, got {type(index).__name__}")
        if index != -1:
            raise ValueError(f"index must be -1 (this cache loads nothing), got {index}")

    def check_hicache_events(self) -> None:
        return None

    def drain_transfers(self) -> None:
        return None

    def host_size(self) -> int:
        return 0

    def evict_host(self, num_tokens: int) -> int:
        check_int("num_tokens", num_tokens, minimum=0)
        return 0

    def prefetch_from_storage(
        self, req_id: str, last_host_node: TreeNode, new_input_tokens: Any
    ) -> bool:
        """No storage tier: validates the request id and node, starts nothing (False)."""
        check_req_id(req_id)
        self.tree.path_to_root(last_host_node)
        return False

    def check_prefetch_progress(self, req_id: str) -> bool:
        check_req_id(req_id)
        return True

    def pop_prefetch_loaded_tokens(self, req_id: str) -> int:
        check_req_id(req_id)
        return 0

    def release_aborted_request(self, req_id: str) -> None:
        check_req_id(req_id)

    def note_prefill(self, tokens: int, seconds: float) -> None:
        check_prefill(tokens, seconds)


def check_req_id(req_id: object) -> str:
    """``req_id`` if a str, else ``TypeError``."""
    if not isinstance(req_id, str):
        raise TypeError(f"req_id must be a str, got {type(req_id).__name__}")
    return req_id


def check_prefill(tokens: object, seconds: object) -> None:
    """``TypeError``/``ValueError`` unless ``tokens`` is an int >= 0 and ``seconds`` a finite
    number >= 0."""
    check_int("tokens", tokens)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"seconds must be a number, got {type(seconds).__name__}")
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"seconds must be a finite number >= 0, got {seconds}")
