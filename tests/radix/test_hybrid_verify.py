"""HybridHiRadixCache with ``verify="all"``: a corrupt host page is never served; the load-back
stops above the node holding it and still returns a usable prefix (or the device one); the
storage tier carries the checksums of every inner pool."""

from __future__ import annotations

import pytest
import torch

from hicache.backends import StorageConfig
from hicache.kernels.checksum import NO_SUM
from hicache.radix import HiCacheConfig, RadixKey
from tests.radix.hybrid_host_rig import HybridHostRig
from tests.radix.storage_helpers import prefetch


def corrupt(rig: HybridHostRig, host_slot: int, inner: int = 0) -> None:
    """Flip one byte of ``host_slot`` in the first layer of inner host pool ``inner``."""
    buf = rig.cache.cache_controller.mem_pool_host.host_pools[inner].kv_buffer  # layer_first
    rows = buf[-1][0] if buf.dim() == 5 else buf[0]
    rows[host_slot].view(torch.uint8).view(-1)[1] ^= 0x08


def load(rig: HybridHostRig, ids: list[int]) -> tuple[torch.Tensor, object]:
    cache = rig.cache
    match = cache.match_prefix(RadixKey(ids))
    slots, node = cache.init_load_back(match.last_host_node, match.host_hit_length)
    cache.consume_load_batch(cache.ready_to_load_host_cache())
    cache.drain_transfers()
    return slots, node


@pytest.mark.parametrize("pattern", ["FSL", "FS", "FL"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_a_corrupt_host_page_stops_the_load_above_its_node(pattern, page_size):
    rig = HybridHostRig(pattern, page_size=page_size, load_back_threshold=0, verify="all")
    short, long = list(range(1, 2 * page_size + 1)), list(range(1, 4 * page_size + 1))
    _, kv, _ = rig.put(short)
    rig.put(long)
    rig.evict_all()
    upper = rig.cache.match_prefix(RadixKey(short)).last_host_node
    lower = rig.cache.match_prefix(RadixKey(long)).last_host_node
    assert lower.parent is upper
    corrupt(rig, int(lower.host_slots[-1]), inner=int(pattern == "FS" and page_size == 4))
    slots, node = load(rig, long)
    assert rig.cache.integrity_failures == 1
    assert node is upper and slots.numel() == len(short)
    for layer, keys in kv.items():
        torch.testing.assert_close(rig.read_keys(layer, slots), keys, rtol=0, atol=0)
    match = rig.cache.match_prefix(RadixKey(long))
    assert match.device_prefix_len + match.host_hit_length == len(short)  # the bad node is gone
    rig.check()


def test_a_load_cut_above_a_node_without_a_state_returns_the_device_prefix():
    rig = HybridHostRig("FL", load_back_threshold=0, verify="all")
    rig.put([1, 2])
    rig.put([1, 2, 3, 4, 5, 6])
    rig.cache.match_prefix(RadixKey([1, 2, 3, 4, 9, 9]))  # splits: 3..4 without a state
    rig.evict_all()
    lower = rig.cache.match_prefix(RadixKey([1, 2, 3, 4, 5, 6])).last_host_node
    corrupt(rig, int(lower.host_slots[0]))
    slots, node = load(rig, [1, 2, 3, 4, 5, 6])
    assert rig.cache.integrity_failures == 1
    assert slots.numel() == 0 and node is rig.cache.root  # nothing was usable on the device
    match = rig.cache.match_prefix(RadixKey([1, 2, 3, 4, 5, 6]))
    assert match.device_prefix_len == 0  # 1..2 is back on the device, its state on the host
    rig.check()


@pytest.mark.parametrize("page_size", [1, 4])
def test_storage_carries_every_inner_pools_checksums(tmp_path, page_size):
    storage = StorageConfig(
        backend="file",
        extra_config={"root": str(tmp_path)},
        model_id="test/hybrid",
        prefetch_threshold=page_size,
        prefetch_policy="wait_complete",
    )
    config = HiCacheConfig(storage=storage, load_back_threshold=0, verify="all")
    ids = list(range(1, 4 * page_size + 1))
    writer = HybridHostRig("FSL", page_size=page_size, config=config)
    _, kv, _ = writer.put(ids)
    writer.cache.drain_transfers()
    reader = HybridHostRig("FSL", page_size=page_size, config=config)
    assert prefetch(reader.cache, "r", ids) == len(ids)
    host = reader.cache.match_prefix(RadixKey(ids)).last_host_node.host_slots
    sums = reader.cache.cache_controller.integrity.store[host[::page_size] // page_size]
    assert bool((sums != NO_SUM).all())  # restored from the objects' trailers
    slots, _ = load(reader, ids)
    assert slots.numel() == len(ids) and reader.cache.integrity_failures == 0
    for layer, keys in kv.items():
        torch.testing.assert_close(reader.read_keys(layer, slots), keys, rtol=0, atol=0)
    writer.cache.close()
    reader.cache.close()
