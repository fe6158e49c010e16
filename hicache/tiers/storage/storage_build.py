"""Building a HiRadixCache's storage tier: backend, guard, keys, I/O threads, cost model."""

from __future__ import annotations

import itertools
from typing import Any

from hicache.backends import (
    HiCacheStorage,
    KVFingerprint,
    StorageConfig,
    StorageKeys,
    create_storage_backend,
)
from hicache.backends.breaker import CircuitBreaker
from hicache.backends.cost import LoadCost
from hicache.backends.deadline import CallRunner
from hicache.backends.guard import GuardedStorage
from hicache.backends.io import StorageIO
from hicache.pools.geometry import PageGeometry
from hicache.radix.events import EXTERNAL, MEDIA, NodeEvents
from hicache.radix.tree import RadixTree
from hicache.tiers.host.host_tier import HostTier
from hicache.tiers.storage.storage_tier import StorageTier

# Local backends fail fast on their own; anything else (remote, or a caller's instance) gets a
# circuit breaker, so a dead server costs one bounded wait and then fast misses.
_LOCAL = ("memory", "file")


def fingerprint_of(host_pool: Any, config: StorageConfig) -> KVFingerprint:
    """What makes ``host_pool``'s page bytes valid: the model (``config``), the device pool's
    page geometry (KV dtype, row shape, layers, page size, parts) and the host layout."""
    geometry: PageGeometry = host_pool.geometry
    heads, dim = geometry.row_shape
    return KVFingerprint(
        model_id=config.model_id,
        model_revision=config.model_revision,
        kv_dtype=str(geometry.dtype).removeprefix("torch."),
        head_num=heads,
        head_dim=dim,
        layer_num=geometry.layer_num,
        page_size=geometry.page_size,
        layout=host_pool.layout,
        is_mla=geometry.parts == 1,
    )


def build_storage(
    tree: RadixTree,
    host: HostTier,
    host_pool: Any,
    config: StorageConfig,
    clock: itertools.count[int],
    events: NodeEvents | None = None,
) -> StorageTier:
    """The storage tier ``config`` describes below ``host``, its backend built and its host
    pool registered, its KV events (the backend's ``medium``) to ``events`` (None: off).
    Backend construction errors (a bad setting, a missing package, an unreachable server at
    setup) propagate: that is set-up, not serving."""
    if isinstance(config.backend, HiCacheStorage):
        backend, name = config.backend, type(config.backend).__name__
    else:
        backend, name = create_storage_backend(config.backend, config.extra_config), config.backend
    breaker = None if name in _LOCAL else CircuitBreaker()
    runner = CallRunner(config.call_timeout_s, config.call_workers, name)
    guarded = GuardedStorage(backend, name, breaker, runner)
    guarded.register_mem_pool_host(host_pool)
    if host.controller.integrity is not None:  # one checksum: host backup -> object -> host
        backend.page_io().attach_checksums(host.controller.integrity.store)
    rank, size = config.tp_rank, config.tp_size
    if host.tp.size > 1:  # the cache's TP group names the shard
        if size not in (1, host.tp.size) or (size > 1 and rank != host.tp.rank):
            raise ValueError(
                f"StorageConfig tp_rank/tp_size ({rank}/{size}) differ from the cache's "
                f"tp_group ({host.tp.rank}/{host.tp.size})"
            )
        rank, size = host.tp.rank, host.tp.size
    keys = StorageKeys(fingerprint_of(host_pool, config), rank, size)
    cost = LoadCost()
    io = StorageIO(
        guarded,
        keys.fingerprint.page_size,
        config.query_batch_pages,
        config.io_batch_pages,
        on_read=cost.note_read,
    )
    medium = next((m for m in MEDIA if m == backend.medium), EXTERNAL)
    tier = StorageTier(tree, host, io, guarded, keys, config, cost, clock, events, medium)
    backend.on_evict = tier.backups.evicted  # forgets evicted pages (and announces them)
    return tier


def storage_from_keywords(
    backend: str | None,
    prefetch_policy: str,
    model_name: str | None,
    extra_config: dict[str, Any] | None,
) -> StorageConfig | None:
    """The ``StorageConfig`` of SGLang's keywords (``hicache_storage_backend``, ...), or None
    when no backend is named."""
    if backend is None:
        return None
    return StorageConfig(
        backend=backend,
        extra_config=extra_config or {},
        model_id=model_name or "unknown",
        prefetch_policy=prefetch_policy,
    )
