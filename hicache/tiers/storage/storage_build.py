"""Building a HiRadixCache's storage tier: backend, guard, keys, I/O threads, cost model; for a
hybrid model (a ``HybridKVPoolHost``) a fingerprint covering its layer pattern, inner pools and
state shapes, and with linear layers a ``StateStorage`` (a second backend instance)."""

from __future__ import annotations

import dataclasses
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
from hicache.backends.composite_pages import STATE_LAYOUT
from hicache.backends.cost import LoadCost
from hicache.backends.deadline import CallRunner
from hicache.backends.guard import GuardedStorage
from hicache.backends.io import StorageIO
from hicache.pools import HybridKVPoolHost
from hicache.pools.geometry import PageGeometry
from hicache.radix.events import EXTERNAL, MEDIA, NodeEvents
from hicache.radix.tree import RadixTree
from hicache.tiers.host.host_components import HostComponents
from hicache.tiers.host.host_tier import HostTier
from hicache.tiers.storage.state_storage import StateStorage
from hicache.tiers.storage.storage_tier import StorageTier

# Local backends fail fast on their own; anything else (remote, or a caller's instance) gets a
# circuit breaker, so a dead server costs one bounded wait and then fast misses.
_LOCAL = ("memory", "file")


def fingerprint_of(host_pool: Any, config: StorageConfig, states: Any = None) -> KVFingerprint:
    """What makes ``host_pool``'s page bytes valid: the model (``config``), the device pool's
    page geometry (KV dtype, row shape, layers, page size, parts) and the host layout; for a
    ``HybridKVPoolHost`` the full pool's geometry, every layer its pages carry, and
    ``pattern``: the layer routes, each inner pool's geometry and the state shapes
    (``states``: the ``MambaPoolHost``, or None)."""
    hybrid = isinstance(host_pool, HybridKVPoolHost)
    geometry: PageGeometry = (host_pool.host_pools[0] if hybrid else host_pool).geometry
    heads, dim = geometry.row_shape
    return KVFingerprint(
        model_id=config.model_id,
        model_revision=config.model_revision,
        kv_dtype=str(geometry.dtype).removeprefix("torch."),
        head_num=heads,
        head_dim=dim,
        layer_num=host_pool.layer_num if hybrid else geometry.layer_num,
        page_size=geometry.page_size,
        layout=host_pool.layout,
        is_mla=geometry.parts == 1,
        pattern=_pattern(host_pool, states) if hybrid else "",
    )


def _pattern(host_pool: HybridKVPoolHost, states: Any) -> str:
    """The layer routes (global layer -> inner pool's layer, is SWA), the inner pools'
    geometries and the state params of a hybrid model, as one string."""
    device = host_pool.device_pool
    routes = sorted(device.layers_mapping.items())
    pools = [_geometry(pool.geometry) for pool in host_pool.host_pools]
    params = None if states is None else states.cache_params
    return repr((routes, device.start_layer, pools, params))


def _geometry(g: PageGeometry) -> tuple[Any, ...]:
    """A pool geometry's fields that give its bytes a meaning (not its device)."""
    return (g.kind, g.layer_num, g.dims, str(g.dtype), g.page_size, g.parts, g.row_shape)


def state_fingerprint(kv: KVFingerprint, states: Any) -> KVFingerprint:
    """The fingerprint of the state objects beside ``kv``'s pages (``states``: the
    ``MambaPoolHost``): one ``slot_bytes`` object per "page" of one state, never MLA-shared
    (each TP rank holds its own heads' states)."""
    return dataclasses.replace(
        kv,
        kv_dtype="uint8",
        head_num=1,
        head_dim=states.slot_bytes,
        page_size=1,
        layout=STATE_LAYOUT,
        is_mla=False,
    )


def build_storage(
    tree: RadixTree,
    host: HostTier,
    host_pool: Any,
    config: StorageConfig,
    clock: itertools.count[int],
    events: NodeEvents | None = None,
    components: HostComponents | None = None,
) -> StorageTier:
    """The storage tier ``config`` describes below ``host``, its backend built and its host
    pool registered, its KV events (the backend's ``medium``) to ``events`` (None: off); with
    ``components`` (a hybrid model's) holding host states, their ``StateStorage`` too, over a
    second instance of the backend (``ValueError`` when ``config.backend`` is an instance).
    Backend construction errors (a bad setting, a missing package, an unreachable server at
    setup) propagate: that is set-up, not serving."""
    states = None if components is None else components.host_states
    if states is not None and isinstance(config.backend, HiCacheStorage):
        raise ValueError(
            "config.backend: a model with linear layers needs a backend by name (its "
            "recurrent states go to a second instance), got an instance"
        )
    guarded = _guarded(config, host_pool)
    backend = guarded.backend
    if host.controller.integrity is not None:  # one checksum: host backup -> object -> host
        backend.page_io().attach_checksums(host.controller.integrity.store)
    keys = StorageKeys(fingerprint_of(host_pool, config, states), *_shard(config, host))
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
    if components is not None and states is not None:
        fingerprint = state_fingerprint(keys.fingerprint, states)
        state_keys = StorageKeys(fingerprint, keys.tp_rank, keys.tp_size)
        ps = tier.page_size
        state_io = _guarded(config, states)
        tier.attach_states(
            StateStorage(state_io, state_keys, components, host.tp, ps, events, medium)
        )
    return tier


def _guarded(config: StorageConfig, host_pool: Any) -> GuardedStorage:
    """``config``'s backend (an instance, or a new one by name), guarded, ``host_pool``
    registered."""
    if isinstance(config.backend, HiCacheStorage):
        backend, name = config.backend, type(config.backend).__name__
    else:
        backend, name = create_storage_backend(config.backend, config.extra_config), config.backend
    breaker = None if name in _LOCAL else CircuitBreaker()
    runner = CallRunner(config.call_timeout_s, config.call_workers, name)
    guarded = GuardedStorage(backend, name, breaker, runner)
    guarded.register_mem_pool_host(host_pool)
    return guarded


def _shard(config: StorageConfig, host: HostTier) -> tuple[int, int]:
    """The TP rank and size naming the shard: the cache's TP group's (``ValueError`` when
    ``config`` names others), else ``config``'s."""
    rank, size = config.tp_rank, config.tp_size
    if host.tp.size > 1:
        if size not in (1, host.tp.size) or (size > 1 and rank != host.tp.rank):
            raise ValueError(
                f"StorageConfig tp_rank/tp_size ({rank}/{size}) differ from the cache's "
                f"tp_group ({host.tp.rank}/{host.tp.size})"
            )
        rank, size = host.tp.rank, host.tp.size
    return rank, size


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
