"""What one stress scenario runs on: a frozen config and the tiny cache stack it builds.

Pools are deliberately tiny (a few device pages, a host tier 2-4x larger) so that device
eviction, backups, host eviction and load-backs happen on almost every operation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from hicache.model import ModelConfig, make_model_pools
from hicache.model.config import LAYER_KINDS
from hicache.pools import (
    ROUTES,
    MHATokenToKVPool,
    MLATokenToKVPool,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from hicache.radix import CheckpointPolicy, HiCacheConfig, HybridConfig
from hicache.tiers.hiradix_cache import HiRadixCache
from hicache.tiers.hybrid_hiradix_cache import HybridHiRadixCache

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
    p_storage_error : rate of storage calls that raise or reads that miss (a hybrid run with
        a storage tier, ``hicache.storage``: ``hicache.stress.hybrid_storage``).
    full_every : after every op its changes are checked (:mod:`hicache.stress.tracker`);
        every this many ops (and at the end) everything is: ``check_invariants``, slot
        ownership from scratch and every cached token's KV bytes.
    device : where the device pool lives ("cpu" or "cuda").
    layers_pattern : None (a full-attention model), or a hybrid model's layers, one letter each
        as ``ModelConfig.layer_pattern`` (``hicache bench --layers-pattern``): ``F`` full
        attention (at least one: the host tier keeps its KV), ``S`` sliding window, ``L``
        linear recurrence (at least one ``S`` or ``L``). The run then drives a
        ``HybridHiRadixCache`` (inclusive tiering only) over ``make_model_pools``' pools.
    window : the ``S`` layers' sliding window in tokens.
    checkpoint : where a model with ``L`` layers takes recurrent states (``every_tokens`` a
        page multiple).
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
    p_storage_error: float = 0.0
    full_every: int = 1000
    device: str = "cpu"
    layers_pattern: str | None = None
    window: int = 4
    checkpoint: CheckpointPolicy = CheckpointPolicy()

    def __post_init__(self) -> None:
        if not isinstance(self.hicache, HiCacheConfig):
            raise TypeError(f"hicache must be a HiCacheConfig, got {type(self.hicache).__name__}")
        route = (self.kind, self.hicache.io_backend, self.hicache.mem_layout)
        if route not in ROUTES:
            raise ValueError(f"(kind, io_backend, layout) must be one of {ROUTES}, got {route}")
        for name in ("page_size", "ops", "full_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("p_alloc_none", "p_transfer_fail", "p_storage_error"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.layers_pattern is not None:
            self._check_hybrid()
        if self.p_storage_error and (self.layers_pattern is None or self.hicache.storage is None):
            raise ValueError("p_storage_error needs a hybrid layers_pattern and hicache.storage")

    def _check_hybrid(self) -> None:
        pattern = self.layers_pattern
        if not isinstance(pattern, str):
            raise TypeError(f"layers_pattern must be a str or None, got {type(pattern).__name__}")
        if set(pattern) - set(LAYER_KINDS) or "F" not in pattern or not set(pattern) & set("SL"):
            raise ValueError(
                f"layers_pattern must use only {LAYER_KINDS!r}, with an F and an S or L, "
                f"got {pattern!r}"
            )
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window must be an int >= 1, got {self.window!r}")
        if not isinstance(self.checkpoint, CheckpointPolicy):
            raise TypeError(
                f"checkpoint must be a CheckpointPolicy, got {type(self.checkpoint).__name__}"
            )
        every = self.checkpoint.every_tokens
        if every is not None and every % self.page_size:
            raise ValueError(f"checkpoint every_tokens={every} must be a multiple of page_size")
        if self.hicache.tiering != "inclusive":
            raise ValueError("hicache.tiering must be 'inclusive' for a hybrid layers_pattern")

    @property
    def fault_rates(self) -> tuple[float, float, float]:
        """``Faults``' rates: (alloc none, transfer fail, storage error)."""
        return self.p_alloc_none, self.p_transfer_fail, self.p_storage_error

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
        tiering += "" if host.storage is None else f"/l3-{host.storage.backend}"
        hybrid = "" if self.layers_pattern is None else f"{self.layers_pattern}/"
        return hybrid + (
            f"{self.kind}/{host.io_backend}/{host.mem_layout}/p{self.page_size}/"
            f"{host.write_policy}/{self.eviction_policy}{tiering}"
        )

    @property
    def hybrid(self) -> HybridConfig | None:
        """The hybrid cache's components (None for a full-attention model)."""
        pattern = self.layers_pattern
        if pattern is None:
            return None
        window = self.window if "S" in pattern else None
        return HybridConfig(window, "L" in pattern, self.checkpoint)

    def with_(self, **changes: Any) -> StressConfig:
        return replace(self, **changes)


@dataclass
class Stack:
    """The pools a scenario drives the cache over."""

    allocator: Any  # TokenToKVPoolAllocator, or SWATokenToKVPoolAllocator (hybrid)
    device_pool: Any
    req_pool: ReqToTokenPool  # a HybridReqToTokenPool for a model with L layers

    @property
    def slot_allocator(self) -> TokenToKVPoolAllocator:
        """The allocator of the full-attention slots (nodes' and requests' slots)."""
        return getattr(self.allocator, "full_attn_allocator", self.allocator)


def build_cache(cfg: StressConfig, stack: Stack, tp_group: Any = None) -> HiRadixCache:
    """The cache under test: a ``HiRadixCache``, or a ``HybridHiRadixCache`` for a hybrid
    ``layers_pattern``."""
    settings: dict[str, Any] = {
        "config": cfg.hicache,
        "eviction_policy": cfg.eviction_policy,
        "tp_group": tp_group,
    }
    args = (stack.req_pool, stack.allocator, cfg.page_size)
    hybrid = cfg.hybrid
    if hybrid is None:
        return HiRadixCache(*args, **settings)
    return HybridHiRadixCache(*args, hybrid=hybrid, **settings)


def build_stack(cfg: StressConfig) -> Stack:
    size = cfg.pages * cfg.page_size
    if cfg.layers_pattern is not None:
        return _hybrid_stack(cfg, size)
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


STATE_CHECKPOINTS = 4  # state slots beyond the live requests': few, so states are evicted


def _hybrid_stack(cfg: StressConfig, size: int) -> Stack:
    """``make_model_pools``' pools of the hybrid model (tiny geometry); the SWA pool holds
    3/4 of the full pool's tokens (at least the live requests' contexts), so the SWA side
    runs short first."""
    pattern = cfg.layers_pattern
    assert pattern is not None
    model = ModelConfig(
        num_layers=len(pattern),
        num_heads=HEADS,
        num_kv_heads=HEADS,
        head_dim=HEAD_DIM,
        attention=cfg.kind,
        kv_lora_rank=MLA_RANK,
        qk_rope_head_dim=MLA_ROPE,
        dtype=torch.float32 if cfg.kind == "mha" else torch.bfloat16,
        layer_pattern=pattern,
        sliding_window=cfg.window,
        linear_state_size=4,
    )
    page, rows = cfg.page_size, MAX_LIVE + 1
    swa = max(size * 3 // 4 // page * page, MAX_LIVE * (cfg.max_context + page))
    track = page > 1 and cfg.checkpoint.at_finish and "L" in pattern  # as the engine's
    pools = make_model_pools(
        model,
        size,
        page,
        cfg.device,
        rows,
        swa_size=min(swa, size),
        state_slots=rows * (3 if track else 1) + STATE_CHECKPOINTS,
        max_context_len=cfg.max_context + page,
        enable_mamba_extra_buffer=track,
    )
    return Stack(pools.allocator, pools.kv, pools.req_to_token)
