"""Memory safety of the host tier: oversized pools are refused before allocating anything, and
the pinned registration of a host pool is released exactly once, by ``close()`` or by GC."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from types import SimpleNamespace

import pytest
import torch

from hicache.pools import (
    HostKVPool,
    MHATokenToKVPool,
    MHATokenToKVPoolHost,
    TokenToKVPoolAllocator,
    host_layouts,
    host_memory,
    host_pool,
)
from hicache.radix import HiRadixCache
from tests.stress.world import device_pool
from tests.stress.world import host_pool as make_host

_GB = 1e9
CASES = [("mha", "layer_first"), ("mha", "page_head"), ("mla", "page_first_direct")]


def _pool_bytes(kind: str, layout: str) -> int:
    """Bytes a 2x host pool of a 16-slot device pool of ``kind`` needs (built for real once)."""
    host = make_host(device_pool(kind, 16), layout)
    return host.kv_buffer.numel() * host.kv_buffer.element_size()


@pytest.fixture()
def ram(monkeypatch: pytest.MonkeyPatch):
    """Set the visible RAM and reserve; any attempt to allocate a host buffer fails the test."""

    def no_allocation(self: HostKVPool) -> torch.Tensor:
        raise AssertionError("the host buffer was allocated before the RAM check refused it")

    def set_ram(available: int, reserve_gb: float, allow_allocation: bool = False) -> None:
        vm = SimpleNamespace(available=available, total=available)
        monkeypatch.setattr(host_layouts.psutil, "virtual_memory", lambda: vm)
        env = dataclasses.replace(host_layouts.ENV, host_ram_reserve_gb=reserve_gb)
        monkeypatch.setattr(host_layouts, "ENV", env)
        if not allow_allocation:
            monkeypatch.setattr(HostKVPool, "_allocate", no_allocation)

    return set_ram


@pytest.mark.parametrize(("kind", "layout"), CASES)
@pytest.mark.parametrize("reserve_gb", [0.0, 0.5])
def test_pool_one_byte_over_ram_minus_reserve_is_refused(ram, kind, layout, reserve_gb):
    need = _pool_bytes(kind, layout)
    ram(need + int(reserve_gb * _GB) - 1, reserve_gb)
    with pytest.raises(ValueError, match="HICACHE_HOST_RAM_RESERVE_GB") as info:
        make_host(device_pool(kind, 16), layout)
    assert "lower host_size_gb or host_to_device_ratio" in str(info.value)


@pytest.mark.parametrize(("kind", "layout"), CASES)
def test_pool_that_fits_exactly_is_built(ram, kind, layout):
    need = _pool_bytes(kind, layout)
    ram(need + int(0.5 * _GB), 0.5, allow_allocation=True)
    assert make_host(device_pool(kind, 16), layout).size == 32


def test_reserve_larger_than_ram_refuses_everything(ram):
    ram(10**9, reserve_gb=2.0)
    with pytest.raises(ValueError, match=r"only 0\.00 GB of RAM is available"):
        make_host(device_pool("mha", 16), "layer_first")


def test_terabyte_pool_is_refused_by_the_real_ram_check():
    """No monkeypatching: a 10 PB request fails with a clear ValueError, never MemoryError."""
    dev = device_pool("mha", 16)
    with pytest.raises(ValueError, match=r"the host pool needs 1000000\d\.\d\d GB but only"):
        MHATokenToKVPoolHost(dev, 0, 1e7, dev.page_size, "layer_first")


@pytest.fixture()
def fake_pinning(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Make CPU host pools 'pin' through recording stand-ins of pin/unpin; returns the log."""
    log: list[tuple[str, int]] = []

    def pin(tensor: torch.Tensor) -> bool:
        log.append(("pin", tensor.data_ptr()))
        return True

    monkeypatch.setattr(host_pool, "is_cuda", lambda device: True)
    monkeypatch.setattr(host_memory, "pin_tensor", pin)
    monkeypatch.setattr(host_memory, "unpin_tensor", lambda t: log.append(("unpin", t.data_ptr())))
    return log


def test_close_releases_the_registration_once(fake_pinning):
    host = make_host(device_pool("mha", 16), "page_first")
    ptr = host.kv_buffer.data_ptr()
    assert host.pinned and fake_pinning == [("pin", ptr)]
    host.close()
    host.close()
    del host
    gc.collect()
    assert fake_pinning == [("pin", ptr), ("unpin", ptr)]


def test_garbage_collection_releases_the_registration(fake_pinning):
    host = make_host(device_pool("mla", 16), "layer_first")
    ptr, ref = host.kv_buffer.data_ptr(), weakref.ref(host)
    del host
    gc.collect()
    assert ref() is None, "the host pool must not keep itself alive"
    assert fake_pinning == [("pin", ptr), ("unpin", ptr)]


def test_close_without_pinning_is_idempotent():
    host = make_host(device_pool("mha", 16), "layer_first")
    assert not host.pinned
    host.close()
    host.close()
    assert host.closed and not host.pinned


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("release", ["close", "gc"])
def test_cuda_registration_is_released(release):
    dev = MHATokenToKVPool(64, 16, torch.bfloat16, 2, 64, 2, "cuda")
    host = MHATokenToKVPoolHost(dev, 2.0, 0, 16, "layer_first")
    buffer = host.kv_buffer  # our own reference outlives the pool
    assert host.pinned and buffer.is_pinned()
    if release == "close":
        host.close()
    else:
        del host
        gc.collect()
    assert not buffer.is_pinned(), "cudaHostUnregister did not run"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_cache_releases_its_host_pool_when_collected():
    dev = MHATokenToKVPool(64, 16, torch.bfloat16, 2, 64, 2, "cuda")
    allocator = TokenToKVPoolAllocator(64, 16, "cuda", kvcache=dev)
    cache = HiRadixCache(None, allocator, 16)
    cache.insert(list(range(32)), allocator.alloc(32))
    buffer = cache.cache_controller.mem_pool_host.kv_buffer
    assert buffer.is_pinned()
    del cache
    gc.collect()
    assert not buffer.is_pinned(), "the host pool of a collected cache is still registered"
