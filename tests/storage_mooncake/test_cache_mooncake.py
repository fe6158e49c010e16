"""HiRadixCache over a real Mooncake Store: two caches share pages through the store, tenants
stay apart, and a killed master costs misses, never an error, while serving goes on."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch

from hicache.backends import StorageConfig
from hicache.backends.mooncake_servers import MooncakeServers
from hicache.radix import RadixKey
from tests.radix.storage_helpers import (
    kv_of,
    load,
    make_stack,
    prefetch,
    random_ids,
    storage_config,
    write_prefix,
)

pytestmark = pytest.mark.mooncake


def _config(servers: MooncakeServers) -> StorageConfig:
    extra = {"master_server_address": servers.master_address}
    return replace(storage_config(servers.logs), backend="mooncake", extra_config=extra)


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_two_caches_share_pages_byte_exact(mooncake: MooncakeServers, layout: str) -> None:
    ids = random_ids(64, seed=hash(layout) % 1000)
    writer = make_stack(_config(mooncake), layout=layout)
    expected = write_prefix(writer, ids, seed=11, extra_key="tenant-a")
    assert writer.cache.stats().storage.backup_pages == 16
    reader = make_stack(_config(mooncake), layout=layout)
    assert prefetch(reader.cache, "other", ids, extra_key="tenant-b") == 0
    assert prefetch(reader.cache, "a", ids, extra_key="tenant-a") == 64
    host_hit, slots = load(reader, ids, extra_key="tenant-a")
    assert host_hit == 64
    for want, got in zip(expected, kv_of(reader, slots), strict=True):
        assert torch.equal(want, got)
    reader.cache.check_invariants()
    writer.cache.close()
    reader.cache.close()


def test_killed_master_serving_goes_on(own_mooncake) -> None:  # type: ignore[no-untyped-def]
    servers = own_mooncake("64 MB")
    stack = make_stack(_config(servers))
    cache = stack.cache
    write_prefix(stack, random_ids(32, seed=1))
    servers.kill_master()
    start = time.monotonic()
    for i in range(6):  # every call a miss; the breaker bounds the time it costs
        ids = random_ids(32, seed=10 + i)
        write_prefix(stack, ids)  # host write, then a storage write that fails
        assert prefetch(cache, f"r{i}", random_ids(32, seed=100 + i)) == 0
        assert len(cache.match_prefix(RadixKey(ids)).device_indices) == 32
    took = time.monotonic() - start
    stats = cache.stats().storage
    assert stats.breaker_state in ("open", "half_open") and stats.failures > 0
    assert took < 30, took  # one bounded wait, then fast misses
    cache.check_invariants()
    cache.close()
