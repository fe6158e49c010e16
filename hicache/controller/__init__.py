"""hicache.controller: per-layer load completion and the host/device transfer controller."""

from __future__ import annotations

from hicache.controller.cache_controller import HiCacheController
from hicache.controller.config import WRITE_POLICIES, ControllerConfig, check_write_policy
from hicache.controller.layer_done import (
    NO_CONSUMER,
    RING_SIZE,
    LayerDoneCounter,
    LayerLoadingEvent,
)
from hicache.controller.operations import CacheOperation, HiCacheAck, pop_finished_acks

__all__ = [
    "NO_CONSUMER",
    "RING_SIZE",
    "WRITE_POLICIES",
    "CacheOperation",
    "ControllerConfig",
    "HiCacheAck",
    "HiCacheController",
    "LayerDoneCounter",
    "LayerLoadingEvent",
    "check_write_policy",
    "pop_finished_acks",
]
