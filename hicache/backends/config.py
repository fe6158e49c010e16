"""StorageConfig: the frozen, validated settings of the storage tier (L3)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hicache.backends.base import HiCacheStorage
from hicache.checks import check_choice, check_int
from hicache.controller.config import check_tiering

__all__ = ["BACKENDS", "PREFETCH_POLICIES", "StorageConfig"]

BACKENDS = ("memory", "file", "mooncake")
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")


def _check_seconds(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")


@dataclass(frozen=True)
class StorageConfig:
    """Settings of a HiRadixCache's storage tier (``HiCacheConfig(storage=...)``).

    Attributes
    ----------
    backend : ``memory``, ``file`` (the default embedded store) or ``mooncake``; or a
        ``HiCacheStorage`` instance built by the caller (its host pool not yet registered).
    extra_config : backend settings (``file``: ``root``, ``max_bytes``; ``mooncake``: see
        ``hicache.backends.mooncake``), passed to ``create_storage_backend``.
    model_id, model_revision : name the model and its weights (a revision or a digest); with
        the pool geometry they form the key fingerprint (``keys.KVFingerprint``).
    tp_rank, tp_size : this rank's shard in the keys.
    prefetch_policy : when a request waiting on a prefetch may run: ``best_effort`` (at once,
        with what has arrived), ``wait_complete`` (when every page has arrived or failed),
        ``timeout`` (the latter, or after ``min(prefetch_timeout_max, prefetch_timeout_base +
        prefetch_timeout_per_ki_token * tokens / 1024)`` seconds).
    prefetch_threshold : storage is queried only for misses of at least this many tokens
        (rounded up to whole pages), and a hit shorter than that is not loaded.
    query_batch_pages, io_batch_pages : pages per ``batch_exists`` / per get or set call.
    call_timeout_s : the deadline of every backend call (seconds, > 0; default 10): a call
        past it is a miss counted as a timeout, abandoned on one of ``call_workers`` worker
        threads (its result discarded, its host slots held until it returns), so a hung
        backend costs ``drain_transfers``/``close``/``reset`` at most about ``call_workers +
        1`` deadlines, and later prefetches go on.
    call_workers : worker threads running backend calls (>= 1); once all of them hold an
        abandoned call, every call is a fast miss until one returns.
    cost_aware : skip a storage load whose expected time (measured bandwidth) exceeds the
        expected recompute time (measured prefill speed); see ``hicache.backends.cost``.
    tiering : ``inclusive`` (default: a page is written to storage when its host backup lands)
        or ``exclusive`` (written when the host tier evicts it: storage holds what the host
        tier let go); ``hicache.controller.TIERINGS``.
    """

    backend: str | HiCacheStorage = "file"
    extra_config: Mapping[str, Any] = field(default_factory=dict)
    model_id: str = "unknown"
    model_revision: str = ""
    tp_rank: int = 0
    tp_size: int = 1
    prefetch_policy: str = "timeout"
    prefetch_threshold: int = 256
    prefetch_timeout_base: float = 2.0
    prefetch_timeout_per_ki_token: float = 0.1
    prefetch_timeout_max: float = 30.0
    query_batch_pages: int = 128
    io_batch_pages: int = 128
    call_timeout_s: float = 10.0
    call_workers: int = 4
    cost_aware: bool = True
    tiering: str = "inclusive"

    def __post_init__(self) -> None:
        if not isinstance(self.backend, HiCacheStorage):
            check_choice("backend", self.backend, BACKENDS)
        if not isinstance(self.extra_config, Mapping):
            raise TypeError(
                f"extra_config must be a mapping, got {type(self.extra_config).__name__}"
            )
        for name in ("model_id", "model_revision"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a str, got {type(getattr(self, name)).__name__}")
        check_int("tp_size", self.tp_size, minimum=1)
        check_int("tp_rank", self.tp_rank)
        if self.tp_rank >= self.tp_size:
            raise ValueError(f"tp_rank must be < tp_size={self.tp_size}, got {self.tp_rank}")
        check_choice("prefetch_policy", self.prefetch_policy, PREFETCH_POLICIES)
        check_tiering(self.tiering)
        check_int("prefetch_threshold", self.prefetch_threshold, minimum=1)
        for name in ("prefetch_timeout_base", "prefetch_timeout_per_ki_token"):
            _check_seconds(name, getattr(self, name))
        _check_seconds("prefetch_timeout_max", self.prefetch_timeout_max)
        check_int("query_batch_pages", self.query_batch_pages, minimum=1)
        check_int("io_batch_pages", self.io_batch_pages, minimum=1)
        _check_seconds("call_timeout_s", self.call_timeout_s)
        if self.call_timeout_s == 0:
            raise ValueError("call_timeout_s must be > 0, got 0")
        check_int("call_workers", self.call_workers, minimum=1)
        if not isinstance(self.cost_aware, bool):
            raise TypeError(f"cost_aware must be a bool, got {type(self.cost_aware).__name__}")

    def may_wait(self, started: float, tokens: int) -> bool:
        """Whether a request of ``tokens`` whose prefetch started at ``started``
        (``time.monotonic``) may wait longer for storage under ``prefetch_policy``."""
        if self.prefetch_policy == "best_effort":
            return False
        if self.prefetch_policy == "wait_complete":
            return True
        return time.monotonic() - started < self.prefetch_timeout(tokens)

    def prefetch_timeout(self, tokens: int) -> float:
        """Seconds a ``timeout`` prefetch of ``tokens`` may keep its request waiting."""
        scaled = self.prefetch_timeout_base + self.prefetch_timeout_per_ki_token * tokens / 1024
        return min(self.prefetch_timeout_max, scaled)
