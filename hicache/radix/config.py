"""Frozen, validated settings of the radix caches: the device tree's and the host tier's."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from hicache.backends import StorageConfig
from hicache.checks import check_int
from hicache.controller import check_tiering, check_write_policy
from hicache.controller.integrity import check_verify
from hicache.pools import check_pair
from hicache.radix.policies import check_policy


@dataclass(frozen=True)
class RadixCacheConfig:
    """Validated settings of a RadixCache (``TypeError``/``ValueError`` on bad input)."""

    page_size: int = 1
    eviction_policy: str = "lru"
    disable: bool = False

    def __post_init__(self) -> None:
        check_int("page_size", self.page_size, minimum=1)
        check_policy(self.eviction_policy)
        if not isinstance(self.disable, bool):
            raise TypeError(f"disable must be a bool, got {type(self.disable).__name__}")


# Bound of hicache_ratio and hicache_size_gb: far past any RAM (an exabyte), and low enough that
# the host pool's size arithmetic never overflows a float; past RAM the pool refuses anyway.
_NUMBER_MAX = 1e9


def _check_number(name: str, value: Any) -> None:
    """``TypeError`` unless an int or float (not bool); ``ValueError`` for NaN, an infinity or
    a value outside ``[0, 1e9]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if not 0 <= value <= _NUMBER_MAX:
        shown = f"{value:.6g}" if abs(value) < 1e300 else "a number past 1e300"
        raise ValueError(f"{name} must be in [0, {_NUMBER_MAX:g}], got {shown}")


@dataclass(frozen=True)
class HiCacheConfig:
    """Validated host-tier settings of a HiRadixCache (``TypeError``/``ValueError`` on bad input).

    Attributes
    ----------
    hicache_ratio : host slots = ratio * device slots (when ``hicache_size_gb`` is 0); a finite
        number in ``[0, 1e9]``.
    hicache_size_gb : host pool size in GB (1e9 bytes) when > 0; a finite number in ``[0, 1e9]``.
    write_policy : ``write_through`` (back up on insert), ``write_through_selective`` (back up
        on the 2nd hit) or ``write_back`` (back up when evicted from the device).
    io_backend : ``auto`` (per batch: copy engines for long runs, the kernel otherwise), ``kernel``
        or ``direct``.
    mem_layout : host layout, supported by ``io_backend`` (``hicache.pools.SUPPORTED_PAIRS``).
    load_back_threshold : host hits shorter than this many tokens are recomputed, not loaded.
    verify : page integrity, ``off`` (default), ``sample`` or ``all``: checksums taken at
        backup, checked on the GPU at load-back; a corrupt page is never served but dropped
        from the host tier and recomputed (``hicache.controller.integrity``).
    verify_sample_period : under ``sample``, one load-back in this many is verified.
    storage : the storage tier (L3) below the host tier, or None (none); see
        ``hicache.backends.StorageConfig``.
    tiering : ``inclusive`` (default: a page backed up to the host stays on the device until
        evicted there) or ``exclusive`` (a page lives on the device or on the host, not both: it
        is copied down only when the device evicts it, whatever ``write_policy`` says, and a
        load-back frees its host copy once landed); ``hicache.controller.TIERINGS``.
    layers_ahead : None (default): a load batch is issued whole by
        ``ready_to_load_host_cache``; an int ``n >= 1``: its first ``n`` layers there, the rest
        as the forward pass reads them (``HiCacheController``'s ``layers_ahead``).
    """

    hicache_ratio: float = 2.0
    hicache_size_gb: float = 0
    write_policy: str = "write_through"
    io_backend: str = "auto"
    mem_layout: str = "layer_first"
    load_back_threshold: int = 10
    verify: str = "off"
    verify_sample_period: int = 8
    storage: StorageConfig | None = None
    layers_ahead: int | None = None
    tiering: str = "inclusive"

    def __post_init__(self) -> None:
        if self.storage is not None and not isinstance(self.storage, StorageConfig):
            raise TypeError(
                f"storage must be a StorageConfig or None, got {type(self.storage).__name__}"
            )
        _check_number("hicache_ratio", self.hicache_ratio)
        _check_number("hicache_size_gb", self.hicache_size_gb)
        check_write_policy(self.write_policy)
        check_pair(self.mem_layout, self.io_backend, name="mem_layout")
        check_int("load_back_threshold", self.load_back_threshold, minimum=0)
        check_verify(self.verify, self.verify_sample_period)
        check_tiering(self.tiering)
        if self.layers_ahead is not None:
            check_int("layers_ahead", self.layers_ahead, minimum=1)

    @property
    def backup_hits(self) -> int | None:
        """Hits a node needs before it is backed up on a match/insert; None: only on eviction
        (``write_back``, and every write policy under exclusive tiering)."""
        if self.tiering == "exclusive":
            return None
        return {"write_through": 0, "write_through_selective": 2}.get(self.write_policy)


def check_config(config: Any, keywords: HiCacheConfig) -> HiCacheConfig:
    """``config`` when it is a ``HiCacheConfig`` and ``keywords`` (the settings given as
    keyword arguments beside it) are all defaults; else ``TypeError``/``ValueError``."""
    if not isinstance(config, HiCacheConfig):
        raise TypeError(f"config must be a HiCacheConfig, got {type(config).__name__}")
    default = HiCacheConfig()
    for item in fields(HiCacheConfig):
        if getattr(keywords, item.name) != getattr(default, item.name):
            raise ValueError(f"pass {item.name} inside config or as a keyword, not both")
    return config
