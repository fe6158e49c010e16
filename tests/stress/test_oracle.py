"""The stress oracle: its memoised table matches ``kv_values``, and the whole-row readers the
incremental checks use agree with the layer-by-layer ones the full sweep uses, in every layout."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import ROUTES
from hicache.radix import HiCacheConfig, HiRadixCache
from hicache.stress.config import StressConfig, build_stack
from hicache.stress.oracle import (
    device_kv,
    device_rows,
    differences,
    expected_rows,
    host_kv,
    host_rows,
    kv_values,
    write_kv,
)


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_table_lookups_equal_kv_values_even_past_the_table(kind):
    pool = build_stack(StressConfig(kind=kind)).device_pool
    gen = torch.Generator().manual_seed(0)
    for high in (50, 3000, 2**21):  # the last is computed directly, past the table's cap
        tokens = torch.randint(0, high, (64,), generator=gen)
        positions, salts = torch.randint(0, 400, (64,), generator=gen), torch.arange(64) % 3
        got = expected_rows(pool, tokens, positions, salts)
        heads, dim = got.shape[2:]
        parts = got.shape[1] // pool.layer_num
        for column in range(got.shape[1]):
            want = kv_values(
                tokens, positions, column // parts, column % parts, heads, dim, pool.dtype, salts
            )
            assert torch.equal(got[:, column], want)


@pytest.mark.parametrize("route", ROUTES, ids=["/".join(r) for r in ROUTES])
def test_row_readers_agree_with_layer_readers(route):
    kind, io_backend, layout = route
    host = HiCacheConfig(io_backend=io_backend, mem_layout=layout)
    cfg = StressConfig(kind=kind, page_size=4, hicache=host)
    stack = build_stack(cfg)
    cache = HiRadixCache(
        stack.req_pool,
        stack.allocator,
        4,
        write_policy="write_through",
        io_backend=io_backend,
        mem_layout=layout,
    )
    host, pool = cache.cache_controller.mem_pool_host, stack.device_pool
    slots, tokens = stack.allocator.alloc(8), torch.arange(3, 11)
    write_kv(pool, slots, tokens, torch.arange(8), salt=1)
    host_slots = host.alloc(8)
    host.backup_from_device_all_layer(pool, host_slots, slots, io_backend)
    want = expected_rows(pool, tokens, torch.arange(8), 1)
    for rows, read, s, tier in (
        (device_rows, device_kv, slots, pool),
        (host_rows, host_kv, host_slots, host),
    ):
        got = rows(tier, s)
        layers = [
            read(tier, layer, part, s)
            for layer in range(pool.layer_num)
            for part in range(want.shape[1] // pool.layer_num)
        ]
        assert torch.equal(got, torch.stack(layers, 1)) and not differences(pool, got, want, s)
    corrupt = device_rows(pool, slots)
    corrupt[5, 1] += 1
    assert differences(pool, corrupt, want, slots) == [
        f"layer {1 if want.shape[1] == 2 else 0} part {0 if want.shape[1] == 2 else 1}: "
        f"slots [{int(slots[5])}] differ"
    ]
