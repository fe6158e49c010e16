"""MambaPoolHost refuses misuse with an error naming the argument, before any change; on CUDA
its transfers are ordered on the current stream (skipped without CUDA)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from hicache.pools import MambaPool, MambaPoolHost
from tests.pools.helpers import POISON, poison
from tests.pools.mamba_helpers import params
from tests.pools.test_mamba_host_pool import device_pool, host_pool, idx, reference_bytes, states

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({}, ValueError, "give size"),
        ({"size": 2, "host_size_gb": 1.0}, ValueError, "not both"),
        ({"size": 0}, ValueError, "size must be >= 1"),
        ({"size": 2.0}, TypeError, "size must be an int"),
        ({"host_size_gb": 1e-9}, ValueError, "at least one page"),
        ({"host_size_gb": -1.0}, ValueError, "host_size_gb"),
        ({"size": 2, "pin_memory": 1}, TypeError, "pin_memory"),
    ],
)
def test_construction_refuses_bad_sizes(kw: dict[str, object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        MambaPoolHost(device_pool(), **kw)  # type: ignore[arg-type]


def test_construction_refuses_a_pool_that_is_not_a_mamba_pool() -> None:
    with pytest.raises(TypeError, match="device_pool must be a MambaPool"):
        MambaPoolHost(object(), size=2)  # type: ignore[arg-type]


def _other_params_pool() -> MambaPool:
    other = params()
    changed = type(other)(
        layers=other.layers, conv=other.conv, temporal=(2, 3, 4), conv_dtype=other.conv_dtype
    )
    return device_pool(cache_params=changed)


BAD_CALLS: list[tuple[str, Callable[[MambaPool], object], type, str]] = [
    ("wrong pool", lambda p: _other_params_pool(), ValueError, r"temporal: host pool \(2, 3, 5\)"),
    ("not a pool", lambda p: object(), TypeError, "device_pool must be a MambaPool"),
]
BAD_SLOTS: list[tuple[torch.Tensor, torch.Tensor, type, str]] = [
    (idx(1, 2), idx(1), ValueError, "equally long"),
    (idx(0), idx(1), IndexError, "device_slots must lie in"),
    (idx(1), idx(6), IndexError, "host_slots must lie in"),
    (idx(1), idx(4), ValueError, "host_slots holds slots that are not allocated"),
    (idx(1, 1), idx(1, 2), ValueError, "device_slots must not repeat"),
    (idx(1, 2), idx(2, 2), ValueError, "host_slots must not repeat"),
    (idx(1).float(), idx(1), TypeError, "device_slots must be int64"),
    (idx(1), idx(1).view(1, 1), ValueError, "host_slots must be 1-D"),
]


def _assert_refused(call: Callable[[], object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize(("dev", "slots", "error", "match"), BAD_SLOTS)
def test_bad_slots_are_refused_both_ways_before_any_change(
    dev: torch.Tensor, slots: torch.Tensor, error: type, match: str
) -> None:
    p = device_pool()
    host = host_pool(p)
    assert host.alloc(3) is not None  # host slots 1..3
    before = [t.clone() for t in states(p)]
    _assert_refused(lambda: host.backup_from_device(p, dev, slots), error, match)
    _assert_refused(lambda: host.load_to_device(p, slots, dev), error, match)
    assert bool((host.flat == POISON).all())
    for t, old in zip(states(p), before, strict=True):
        assert torch.equal(t.view(torch.uint8), old.view(torch.uint8))


@pytest.mark.parametrize(("name", "pool_of", "error", "match"), BAD_CALLS)
def test_a_mismatched_device_pool_is_refused_both_ways(
    name: str, pool_of: Callable[[MambaPool], object], error: type, match: str
) -> None:
    p = device_pool()
    host = host_pool(p)
    assert host.alloc(1) is not None
    other = pool_of(p)
    _assert_refused(lambda: host.backup_from_device(other, idx(1), idx(1)), error, match)  # type: ignore[arg-type]
    _assert_refused(lambda: host.load_to_device(other, idx(1), idx(1)), error, match)  # type: ignore[arg-type]
    assert bool((host.flat == POISON).all())


def test_a_device_slot_not_allocated_is_refused() -> None:
    p = device_pool()
    p.free(idx(2))
    host = host_pool(p)
    assert host.alloc(1) is not None
    _assert_refused(lambda: host.backup_from_device(p, idx(2), idx(1)), ValueError, "device_slots")


def test_a_closed_pool_refuses_transfers() -> None:
    p = device_pool()
    host = host_pool(p)
    assert host.alloc(1) is not None
    host.close()
    host.close()  # idempotent
    _assert_refused(lambda: host.backup_from_device(p, idx(1), idx(1)), RuntimeError, "closed")


@cuda_only
@pytest.mark.gpu
@pytest.mark.parametrize("pin_memory", [True, False])
def test_cuda_transfers_are_ordered_on_the_current_stream(pin_memory: bool) -> None:
    p = device_pool("cuda", size=64)
    host = MambaPoolHost(p, size=64, pin_memory=pin_memory)
    poison(host.flat)
    assert host.pinned is pin_memory and host.flat.is_pinned() is pin_memory
    slots = host.alloc(64)
    assert slots is not None
    order = torch.randperm(64) + 1
    expected = [reference_bytes(p, s) for s in order.tolist()]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        event = host.backup_from_device(p, order, slots)
        for t in states(p):  # queued after the backup: must not reach the host copies
            t.view(torch.uint8).fill_(0)
        load = host.load_to_device(p, slots, order)
    event.synchronize()
    for slot, want in zip(slots.tolist(), expected, strict=True):
        assert torch.equal(host.page_bytes(slot), want)
    load.synchronize()
    for slot, want in zip(order.tolist(), expected, strict=True):
        assert torch.equal(reference_bytes(p, slot), want)
