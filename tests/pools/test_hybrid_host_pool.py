"""HybridKVPoolHost: sizes, one allocator for every inner pool, load plans by global layer,
misuse, and which host pool the host tier builds for which device pool."""

from __future__ import annotations

import pytest
import torch

from hicache.controller import HiCacheController
from hicache.model.hybrid_pools import make_model_pools
from hicache.pools import (
    HybridKVPoolHost,
    MHATokenToKVPool,
    MHATokenToKVPoolHost,
    MLATokenToKVPoolHost,
    TokenToKVPoolAllocator,
)
from hicache.radix import HiCacheConfig
from hicache.tiers.host.host_build import build_controller, build_host_pool
from tests.controller.hybrid_rig import (
    backed_up,
    config,
    every_buffer,
    landed,
    make_hybrid_rig,
    poison,
)

PAGE = 4


def composite(pattern: str = "FSLSF", kind: str = "mha", size: int = 24, swa: int = 16):
    pools = make_model_pools(config(pattern, kind), size, PAGE, "cpu", rows=2, swa_size=swa)
    return pools.kv, pools.allocator


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_every_inner_pool_has_the_full_pools_host_slots(kind):
    kv, _ = composite(kind=kind)
    host = HybridKVPoolHost(kv, 1.5, 0, PAGE, "page_first")
    assert [p.size for p in host.host_pools] == [36, 36] == [host.size] * 2
    assert host.slot_bytes == sum(p.slot_bytes for p in host.host_pools)
    assert isinstance(
        host.host_pools[0], MLATokenToKVPoolHost if kind == "mla" else MHATokenToKVPoolHost
    )
    assert host.layer_num == 5 and host.item_size == host.host_pools[0].item_size


def test_host_size_gb_counts_every_inner_pools_bytes():
    kv, _ = composite()
    one = HybridKVPoolHost(kv, 1.0, 0, PAGE, "layer_first")
    gb = 10 * PAGE * one.slot_bytes / 1e9
    assert HybridKVPoolHost(kv, 1.0, gb, PAGE, "layer_first").size == 10 * PAGE


def test_the_full_pools_allocator_hands_out_every_inner_pools_slots():
    kv, _ = composite()
    host = HybridKVPoolHost(kv, 1.0, 0, PAGE, "layer_first")
    got = host.alloc(8)
    assert got is not None and host.available_size() == host.size - 8
    assert host.host_pools[1].available_size() == host.size
    host.check_invariants()
    assert host.free(got) == 8 and torch.equal(host.free_slots(), torch.arange(host.size))
    host.host_pools[1].alloc(PAGE)
    with pytest.raises(RuntimeError, match="inner pool's own allocator"):
        host.check_invariants()


def test_a_load_plan_runs_global_layers_and_copies_nothing_for_a_linear_one():
    rig = make_hybrid_rig("FSLSF", page_size=PAGE)
    host, want = backed_up(rig, 8)
    slots = rig.allocator.alloc(8)
    poison(rig.kv)
    plan = rig.host.plan_load(rig.kv, host, slots, "kernel")
    assert plan.num_layers == 5
    before = [raw.clone() for raw in every_buffer(rig.kv)]
    plan.run(2)  # the L layer
    assert all(map(torch.equal, every_buffer(rig.kv), before))
    plan.run(3)  # an S layer: its SWA inner layer 1 lands
    assert landed(rig.kv, want, slots) == [3]
    for bad, error in ((True, TypeError), ("1", TypeError), (-1, ValueError), (5, ValueError)):
        with pytest.raises(error, match="layer_id"):
            plan.run(bad)
    rig.host.close()
    for layer in (1, 2):
        with pytest.raises(RuntimeError, match="closed"):
            plan.run(layer)


def test_transfers_count_every_inner_pools_bytes():
    rig = make_hybrid_rig("FSFS", page_size=PAGE)
    backed_up(rig, 8)
    assert rig.controller.stats().d2h_bytes == 8 * rig.host.slot_bytes


def test_misuse_is_refused_before_any_change():
    kv, allocator = composite()
    plain = MHATokenToKVPool(16, PAGE, torch.float32, 2, 8, 2, "cpu")
    with pytest.raises(TypeError, match="device_pool must be a SWAKVPool or HybridLinearKVPool"):
        HybridKVPoolHost(plain, 1.0, 0, PAGE, "layer_first")
    for page in (0, 2 * PAGE):
        with pytest.raises(ValueError, match="page_size must equal device_pool.page_size"):
            HybridKVPoolHost(kv, 1.0, 0, page, "layer_first")
    host = HybridKVPoolHost(kv, 1.0, 0, PAGE, "layer_first")
    with pytest.raises(ValueError, match="verify must be one of"):
        HiCacheController(allocator, host, PAGE, verify="most")
    assert kv.layer_transfer_counter is None
    with pytest.raises(ValueError, match="staging"):
        host.backup_from_device_all_layer(kv, host.alloc(4), allocator.alloc(4), "kernel", object())
    plain_host = MHATokenToKVPoolHost(plain, 1.0, 0, PAGE, "layer_first")
    with pytest.raises(ValueError, match="kind: host pool MHA, device pool SWAKVPool"):
        HiCacheController(allocator, plain_host, PAGE)


def test_a_device_pool_of_other_layers_is_named():
    kv, _ = composite("FSLSF")
    other, other_alloc = composite("FSFSL")
    twin, twin_alloc = composite("FSLSF")
    host = HybridKVPoolHost(kv, 1.0, 0, PAGE, "layer_first")
    assert host.mismatch(twin) == [] and "layers" in host.mismatch(other)[0]
    with pytest.raises(ValueError, match="layers"):
        HiCacheController(other_alloc, host, PAGE)
    HiCacheController(twin_alloc, host, PAGE)  # the same geometry: accepted


def test_the_host_tier_builds_the_host_pool_of_the_device_pool():
    cfg = HiCacheConfig(hicache_ratio=1.0)
    plain = MHATokenToKVPool(16, PAGE, torch.float32, 2, 8, 2, "cpu")
    plain_alloc = TokenToKVPoolAllocator(16, PAGE, "cpu", kvcache=plain)
    assert type(build_host_pool(plain_alloc, PAGE, cfg)) is MHATokenToKVPoolHost
    for pattern in ("FSLSF", "LFLF"):
        _, allocator = composite(pattern)
        ctrl = build_controller(allocator, PAGE, cfg)
        assert isinstance(ctrl.mem_pool_host, HybridKVPoolHost)
        assert ctrl.layer_done_counter.num_layers == len(pattern)
