"""MambaPoolHost: states round trip device -> host -> device against plain-torch references."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import MambaPool, MambaPoolHost, MambaStateParams
from hicache.pools.mamba_slots import MambaSlots
from tests.pools.helpers import DEVICES, POISON, fill_random, poison
from tests.pools.mamba_helpers import params

DTYPE_PAIRS = [(torch.bfloat16, torch.float32), (torch.float16, torch.float16)]


def device_pool(
    device: str = "cpu", size: int = 6, cache_params: MambaStateParams | None = None, **kw: object
) -> MambaPool:
    """A pool with every slot allocated and every state random (never zeros)."""
    p = MambaPool(size=size, cache_params=cache_params or params(), device=device, **kw)  # type: ignore[arg-type]
    assert p.alloc(size) is not None
    fill_random(states(p), seed=size)
    return p


def states(p: MambaPool) -> list[torch.Tensor]:
    return [info.tensor for info in p.state_tensors]


def idx(*slots: int) -> torch.Tensor:
    return torch.tensor(slots, dtype=torch.int64)


def reference_bytes(p: MambaPool, slot: int) -> torch.Tensor:
    """Slot ``slot``'s state in the documented order: tensors, then layers, then C order."""
    return torch.cat([t[:, slot].contiguous().cpu().view(-1).view(torch.uint8) for t in states(p)])


def host_pool(p: MambaPool, size: int = 5) -> MambaPoolHost:
    host = MambaPoolHost(p, size=size)
    poison(host.flat)
    return host


@pytest.mark.parametrize(("conv_dtype", "temporal_dtype"), DTYPE_PAIRS)
def test_a_slot_holds_mamba_cache_per_req_bytes_in_state_tensor_order(
    conv_dtype: torch.dtype, temporal_dtype: torch.dtype
) -> None:
    cache_params = params(conv_dtype, temporal_dtype)
    host = MambaPoolHost(MambaPool(size=2, cache_params=cache_params, device="cpu"), size=3)
    assert host.slot_bytes == cache_params.mamba_cache_per_req
    assert [s.name for s in host.sections] == ["conv0", "conv1", "temporal"]
    conv = [2 * 18 * conv_dtype.itemsize, 2 * 12 * conv_dtype.itemsize]
    assert [s.offset for s in host.sections] == [0, conv[0], conv[0] + conv[1]]
    assert host.mem_usage_bytes() == 3 * cache_params.mamba_cache_per_req


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("conv_dtype", "temporal_dtype"), DTYPE_PAIRS)
def test_scattered_states_round_trip_and_nothing_else_changes(
    device: str, conv_dtype: torch.dtype, temporal_dtype: torch.dtype
) -> None:
    cache_params = params(conv_dtype, temporal_dtype)
    src = device_pool(device, cache_params=cache_params)
    host = host_pool(src)
    host_slots = host.alloc(5)
    assert host_slots is not None
    used = host_slots[[2, 0, 4]]
    host.backup_from_device(src, idx(5, 2, 4), used).synchronize()
    for dev_slot, host_slot in zip([5, 2, 4], used.tolist(), strict=True):
        assert torch.equal(host.page_bytes(host_slot), reference_bytes(src, dev_slot))
    for host_slot in host_slots[[1, 3]].tolist():
        assert bool((host.page_bytes(host_slot) == POISON).all())

    dst = device_pool(device, size=7, cache_params=cache_params)
    before = [t.clone() for t in states(dst)]
    host.load_to_device(dst, used, idx(1, 7, 3)).synchronize()
    for d_src, d_dst in [(5, 1), (2, 7), (4, 3)]:
        assert torch.equal(reference_bytes(dst, d_dst), reference_bytes(src, d_src))
    untouched = [0, 2, 4, 5, 6]
    for t, old in zip(states(dst), before, strict=True):
        assert torch.equal(t[:, untouched].view(torch.uint8), old[:, untouched].view(torch.uint8))


def test_a_state_survives_the_bytes_round_trip_in_every_form() -> None:
    src = device_pool()
    host = host_pool(src)
    (slot,) = host.alloc(1).tolist()  # type: ignore[union-attr]
    host.backup_from_device(src, idx(3), idx(slot))
    exported = host.page_bytes(slot)
    for data in (bytes(exported.numpy()), bytearray(exported.numpy()), exported.clone()):
        other = host_pool(src, size=2)
        (dst_slot,) = other.alloc(1).tolist()  # type: ignore[union-attr]
        other.load_bytes(dst_slot, data)
        dst = device_pool(size=4)
        other.load_to_device(dst, idx(dst_slot), idx(2))
        assert torch.equal(reference_bytes(dst, 2), reference_bytes(src, 3))


def test_load_bytes_refuses_a_wrong_length_or_type_before_writing() -> None:
    host = host_pool(device_pool())
    (slot,) = host.alloc(1).tolist()  # type: ignore[union-attr]
    for data in (bytes(host.slot_bytes - 1), torch.zeros(host.slot_bytes + 1, dtype=torch.uint8)):
        with pytest.raises(ValueError, match=f"data must be {host.slot_bytes} bytes"):
            host.load_bytes(slot, data)
    with pytest.raises(TypeError, match="data must be uint8"):
        host.load_bytes(slot, torch.zeros(host.slot_bytes, dtype=torch.float32))
    with pytest.raises(TypeError, match="data must be a uint8 tensor or bytes-like"):
        host.load_bytes(slot, [0] * host.slot_bytes)  # type: ignore[arg-type]
    assert bool((host.page_bytes(slot) == POISON).all())


@pytest.mark.parametrize(("slot", "error"), [(0, IndexError), (6, IndexError), (2, ValueError)])
def test_bytes_of_a_slot_not_handed_out_are_refused(slot: int, error: type) -> None:
    host = host_pool(device_pool())
    assert host.alloc(1) is not None  # slot 1
    with pytest.raises(error, match="slot"):
        host.page_bytes(slot)
    with pytest.raises(error, match="slot"):
        host.load_bytes(slot, bytes(host.slot_bytes))


def test_alloc_free_and_invariants() -> None:
    host = MambaPoolHost(device_pool(), size=3)
    slots = host.alloc(2)
    assert slots is not None and slots.dtype == torch.int64 and slots.device.type == "cpu"
    assert sorted(slots.tolist()) == [1, 2] and host.available_size() == 1
    assert host.alloc(2) is None and host.available_size() == 1  # nothing taken
    host.free(slots[:1])
    with pytest.raises(ValueError, match="slots holds slots that are not allocated"):
        host.free(slots[:1])  # a double free
    with pytest.raises(IndexError, match="slots must lie in"):
        host.free(idx(4))
    host.check_invariants()
    host.clear()
    assert host.available_size() == 3 and not host.is_allocated(2)
    host.check_invariants()


def test_check_invariants_reports_a_slot_listed_twice() -> None:
    slots = MambaSlots(3)
    slots.release([1])  # unchecked: 1 is already free
    with pytest.raises(RuntimeError, match="twice"):
        slots.check_invariants()


def test_speculative_buffers_are_not_carried() -> None:
    src = device_pool(speculative_num_draft_tokens=2)
    host = MambaPoolHost(src, size=2)
    assert host.slot_bytes == src.cache_params.mamba_cache_per_req
    (slot,) = host.alloc(1).tolist()  # type: ignore[union-attr]
    host.backup_from_device(src, idx(4), idx(slot))
    assert torch.equal(host.page_bytes(slot), reference_bytes(src, 4))


def test_size_from_host_size_gb() -> None:
    p = device_pool()
    host = MambaPoolHost(p, host_size_gb=10.5 * p.cache_params.mamba_cache_per_req / 1e9)
    assert host.size == 10


def test_int32_slots_are_accepted_as_by_mamba_pool() -> None:
    src = device_pool()
    host = host_pool(src)
    assert host.alloc(2) is not None
    host.backup_from_device(src, idx(6, 1).int(), idx(2, 1).int())
    assert torch.equal(host.page_bytes(2), reference_bytes(src, 6))
    assert torch.equal(host.page_bytes(1), reference_bytes(src, 1))
