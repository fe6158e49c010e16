"""Device slot ids as views: a run of consecutive ids goes to the device as a slice of the ids
kept there (no copy), anything else by one copy; each result carries its CPU ids."""

from __future__ import annotations

import pytest
import torch

from hicache.devices import host_copy, known_host_copy
from hicache.pools.allocator import TokenToKVPoolAllocator
from hicache.pools.slot_ids import SlotIds

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
