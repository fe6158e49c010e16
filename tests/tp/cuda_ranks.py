"""Rank functions of the CUDA TP tests (module level: ``launch_ranks`` pickles them by name).

Each rank runs on ``cuda:{rank % device_count}`` (two ranks share the GPU of a one-GPU
machine) and reports back plain values.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hicache.devices import canonical_device
from hicache.model import TPShard
from hicache.pools import ROUTES
from hicache.tp import TPGroup
from tests.radix.hiradix_rig import (
    assert_kv,
    device_pool,
    load_all,
    make_cache,
    put,
    scramble_free,
    tokens_of,
)

PAGE = 16


def placement(group: Any) -> dict[str, Any]:
    """The rank's current GPU and backend, a model all-reduce of a CUDA tensor, and where
    the cache's agreement runs."""
    shard, tp = TPShard.of(group), TPGroup(group, timeout_s=30)
    x = torch.full((3,), float(shard.rank + 1), device=canonical_device("cuda"))
    return {
        "device": str(canonical_device("cuda")),
        "backend": str(dist.get_backend(group)),
        "sum": shard.all_reduce(x).cpu().tolist(),
        "sum_device": str(x.device),
        "agree": tp.agree([shard.rank + 5], [shard.rank], where="cuda ranks"),
    }


def load_back(group: Any) -> dict[str, Any]:
    """Every (kind, io_backend, layout) route on this rank's GPU under a debug TPGroup (tree
    digests compared at every ``check_hicache_events``): put, back up, evict, load back, and
    compare every byte. ``{route: "ok" or what differed}``, the pools' devices, pinning."""
    tp = TPGroup(group, timeout_s=60, debug=True)
    out: dict[str, Any] = {"routes": {}}
    for kind, io_backend, layout in ROUTES:
        cache = make_cache(
            kind,
            io_backend,
            layout,
            PAGE,
            pages=8,
            device=str(canonical_device("cuda")),
            tp_group=tp,
        )
        out["device"] = str(device_pool(cache).device)
        out["pinned"] = cache.cache_controller.mem_pool_host.pinned
        out["routes"][f"{kind}/{io_backend}/{layout}"] = _round_trip(cache)
    out["collectives"] = tp.collectives
    return out


def _round_trip(cache: Any) -> str:
    tokens = tokens_of(3 * PAGE, seed=7)
    put(cache, tokens)
    cache.check_hicache_events()  # under TP: issues the backup
    torch.cuda.synchronize()
    cache.check_hicache_events()  # every rank's write has landed: released
    cache.evict(cache.total_size())
    assert cache.total_size() == 0 and cache.host_size() == len(tokens)
    scramble_free(cache)
    prefix = load_all(cache, tokens)
    torch.cuda.synchronize()
    try:
        assert_kv(device_pool(cache), prefix, tokens)
        result = "ok"
    except AssertionError as err:
        result = str(err)
    cache.drain_transfers()
    cache.check_invariants()
    return result
