"""hicache.controller: per-layer load completion and the host/device transfer controller."""

from __future__ import annotations

from hicache.controller.cache_controller import HiCacheController
from hicache.controller.config import TIERINGS, WRITE_POLICIES, check_tiering, check_write_policy
from hicache.controller.layer_done import NO_CONSUMER, LayerDoneCounter, LayerLoadingEvent
from hicache.controller.operations import HiCacheAck, pop_finished_acks
from hicache.controller.stats import TransferStats

__all__ = [
    "NO_CONSUMER",
    "TIERINGS",
    "WRITE_POLICIES",
    "HiCacheAck",
    "HiCacheController",
    "LayerDoneCounter",
    "LayerLoadingEvent",
    "TransferStats",
    "check_tiering",
    "check_write_policy",
    "pop_finished_acks",
]
