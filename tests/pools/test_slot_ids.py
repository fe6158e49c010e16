"""Device slot ids as views: a run of consecutive ids goes to the device as a slice of the ids
kept there (no copy), anything else by one copy; each result carries its CPU ids."""

from __future__ import annotations

import pytest
import torch

from hicache.devices import host_copy, known_host_copy
from hicache.pools import MHATokenToKVPoolHost
from hicache.pools.allocator import TokenToKVPoolAllocator
from hicache.pools.slot_ids import SlotIds
from tests.kernels.cases import POISON
from tests.pools.helpers import as_bytes, fill_random, mha_pool, poison

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_on_the_cpu_the_ids_are_handed_back_as_they_are() -> None:
    ids = SlotIds(64, torch.device("cpu"))
    run = torch.arange(8, 24)
    assert ids.on_device(run) is run


@cuda
@pytest.mark.parametrize(
    "values, viewed",
    [
        (list(range(16, 48)), True),  # one run
        ([5], True),
        ([16, 17, 19, 18], False),  # its last id does not end a run from its first
        ([16, 18, 17, 19], False),  # ends agree with a run, the middle does not
        (list(range(60, 70)), False),  # past the kept ids
        ([], False),
    ],
)
def test_cuda_ids_are_a_view_only_for_one_run_in_range(values, viewed) -> None:
    ids = SlotIds(64, torch.device("cuda"))
    host = torch.tensor(values, dtype=torch.int64)
    out = ids.on_device(host)
    assert out.is_cuda and out.dtype == torch.int64
    assert known_host_copy(out) is host  # carried: read without asking the device
    torch.cuda.synchronize()
    assert out.cpu().tolist() == values
    kept = ids.on_device(torch.arange(0, 4))  # a run: the kept ids' storage
    assert (out.untyped_storage().data_ptr() == kept.untyped_storage().data_ptr()) is viewed


@cuda
def test_cuda_allocations_of_one_run_are_views_and_free_without_a_sync() -> None:
    alloc = TokenToKVPoolAllocator(256, page_size=16, device="cuda")
    first = alloc.alloc(64)
    second = alloc.alloc(32)
    assert first is not None and second is not None
    torch.cuda.synchronize()
    for slots in (first, second):
        assert torch.equal(slots.cpu(), host_copy(slots))
        assert slots.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
    torch.cuda.set_sync_debug_mode("error")
    try:
        before = alloc.available_size()
        alloc.free(first)
        assert alloc.available_size() == before + 64
    finally:
        torch.cuda.set_sync_debug_mode("default")


@cuda
def test_cuda_backup_and_load_with_host_ids_of_one_run_are_byte_exact() -> None:
    """Host slots of one run go to the kernels as a view of the host pool's kept ids: every
    layer's bytes land where they should, nothing else is written."""
    dev = mha_pool(size=64, page_size=16, device="cuda", layers=3)
    host = MHATokenToKVPoolHost(dev, 2.0, 0, 16, "layer_first")
    fill_random([layer for part in dev.part_buffers for layer in part], seed=3)
    original = [[layer.clone() for layer in part] for part in dev.part_buffers]
    src, h = torch.arange(16, 48), torch.arange(64, 96)  # device and host slots: one run each
    poison(host.kv_buffer)
    host.backup_from_device_all_layer(dev, h, src.cuda(), "kernel")
    torch.cuda.synchronize()
    for part, orig in zip(host.host_parts, original, strict=True):
        for layer in range(dev.layer_num):
            assert torch.equal(as_bytes(part[layer][h]), as_bytes(orig[layer][src].cpu()))
    for layer in (layer for part in dev.part_buffers for layer in part):
        poison(layer)
    dst = torch.arange(32, 64)
    for layer in range(dev.layer_num):
        host.load_to_device_per_layer(dev, h, dst.cuda(), layer, "kernel")
    torch.cuda.synchronize()
    for part, orig in zip(dev.part_buffers, original, strict=True):
        for layer in range(dev.layer_num):
            assert torch.equal(as_bytes(part[layer][dst]), as_bytes(orig[layer][src]))
            untouched = torch.ones(part[layer].shape[0], dtype=torch.bool, device="cuda")
            untouched[dst.cuda()] = False
            assert bool((as_bytes(part[layer][untouched]) == POISON).all())
