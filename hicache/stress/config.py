"""What one stress scenario runs on: a frozen config and the tiny cache stack it builds.

Pools are deliberately tiny (a few device pages, a host tier 2-4x larger) so that device
eviction, backups, host eviction and load-backs happen on almost every operation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from hicache.pools import (
    ROUTES,
    MHATokenToKVPool,
    MLATokenToKVPool,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from hicache.radix import HiCacheConfig

KINDS = ("mha", "mla")
LAYERS, HEADS, HEAD_DIM = 2, 2, 8
MLA_RANK, MLA_ROPE = 8, 4
MAX_LIVE = 2  # requests in flight at once
# A host tier 3x the device pool, and host hits of any length loaded back (to load a lot).
HOST_TIER = HiCacheConfig(hicache_ratio=3.0, load_back_threshold=1)


@dataclass(frozen=True)
class StressConfig:
    """One scenario.

    Attributes
    ----------
    kind : attention kind; with ``hicache.io_backend`` and ``hicache.mem_layout`` it is one of
        the host transfer routes (:data:`ROUTES`).
    page_size : tokens per page (1 and 64 are the interesting ones).
    eviction_policy : the tree's (``lru``, ``mru``, ...: ``mru`` evicts what was just matched
        first, the adversarial order).
    hicache : the cache's host tier (write policy, tiering, route, host/device ratio,
        load-back threshold); :data:`HOST_TIER` by default.
    ops : random operations to run; seed : their seed (a run replays exactly).
    device_pages : device pool size in pages (tiny on purpose).
    conversations : conversations in the workload (few: the same prefixes come back often).
    p_alloc_none, p_transfer_fail : fault rates (allocator short, transfer raising mid-batch).
    full_every : after every op its changes are checked (:mod:`hicache.stress.tracker`);
        every this many ops (and at the end) everything is: ``check_invariants``, slot
        ownership from scratch and every cached token's KV bytes.
    device : where the device pool lives ("cpu" or "cuda").
    """

    kind: str = "mha"
    page_size: int = 1
    eviction_policy: str = "lru"
    hicache: HiCacheConfig = HOST_TIER
    ops: int = 200
    seed: int = 0
    device_pages: int | None = None
    conversations: int = 8
    p_alloc_none: float = 0.0
    p_transfer_fail: float = 0.0
    full_every: int = 1000
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not isinstance(self.hicache, HiCacheConfig):
            raise TypeError(f"hicache must be a HiCacheConfig, got {type(self.hicache).__name__}")
        route = (self.kind, self.hicache.io_backend, self.hicache.mem_layout)
        if route not in ROUTES:
            raise ValueError(f"(kind, io_backend, layout) must be one of {ROUTES}, got {route}")
        for name in ("page_size", "ops", "full_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("p_alloc_none", "p_transfer_fail"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")

    @property
    def unit(self) -> int:
        """Workload length unit in tokens: prompts and turns are a few units long."""
        return max(self.page_size, 8)

    @property
    def pages(self) -> int:
        """Device pages: enough for the live requests' longest contexts, little more."""
        if self.device_pages is not None:
            return self.device_pages
        return MAX_LIVE * self.max_context // self.page_size + 1

    @property
    def max_context(self) -> int:
        """Tokens a conversation may grow to before it starts over (a page multiple)."""
        return -(-5 * self.unit // self.page_size) * self.page_size

    def label(self) -> str:
        host = self.hicache
        tiering = "/exclusive" if host.tiering == "exclusive" else ""
        return (
            f"{self.kind}/{host.io_backend}/{host.mem_layout}/p{self.page_size}/"
            f"{host.write_policy}/{self.eviction_policy}{tiering}"
        )

    def with_(self, **changes: Any) -> StressConfig:
        return replace(self, **changes)


@dataclass
class Stack:
    """The pools a scenario drives the cache over."""

    allocator: TokenToKVPoolAllocator
    device_pool: Any
    req_pool: ReqToTokenPool


def build_stack(cfg: StressConfig) -> Stack:
    size = cfg.pages * cfg.page_size
    if cfg.kind == "mha":
        pool: Any = MHATokenToKVPool(
            size, cfg.page_size, torch.float32, HEADS, HEAD_DIM, LAYERS, cfg.device
        )
    else:
        pool = MLATokenToKVPool(
            size, cfg.page_size, torch.bfloat16, MLA_RANK, MLA_ROPE, LAYERS, cfg.device
        )
    allocator = TokenToKVPoolAllocator(size, cfg.page_size, cfg.device, kvcache=pool)
    req_pool = ReqToTokenPool(MAX_LIVE + 1, cfg.max_context + cfg.page_size, cfg.device)
    return Stack(allocator, pool, req_pool)
