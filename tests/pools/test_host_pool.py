"""Host pools: layouts and shapes, sizing, RAM refusal, slot accounting, close (CPU)."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from types import SimpleNamespace

import pytest
import torch

from hicache.pools import MHATokenToKVPoolHost, MLATokenToKVPoolHost, host_layouts
from hicache.pools.host_pool import HostKVPool
from tests.pools.helpers import mha_pool, mla_pool

MHA_SHAPES = {
    "layer_first": (2, 3, 128, 2, 8),
    "page_first": (2, 128, 3, 2, 8),
    "page_first_direct": (2, 8, 3, 16, 2, 8),
    "page_head": (2, 8, 2, 16, 3, 8),
}
MLA_SHAPES = {
    "layer_first": (3, 128, 1, 24),
    "page_first": (128, 3, 1, 24),
    "page_first_direct": (8, 3, 16, 1, 24),
}


@pytest.mark.parametrize("layout", list(MHA_SHAPES))
def test_mha_layout_shapes(layout: str) -> None:
    host = MHATokenToKVPoolHost(mha_pool(), 2.0, 0, 16, layout)
    assert host.kv_buffer.shape == MHA_SHAPES[layout]
    assert host.k_buffer.shape == host.v_buffer.shape == MHA_SHAPES[layout][1:]
    assert host.kv_buffer.dtype == torch.float16 and host.device == torch.device("cpu")
    assert (host.size, host.item_size, host.layout_dim) == (128, 32, 96)
    assert host.pinned is False  # a CPU device pool is never pinned


@pytest.mark.parametrize("layout", list(MLA_SHAPES))
def test_mla_layout_shapes(layout: str) -> None:
    host = MLATokenToKVPoolHost(mla_pool(dtype=torch.float8_e4m3fn), 2.0, 0, 16, layout)
    assert host.kv_buffer.shape == MLA_SHAPES[layout]
    assert host.kv_buffer.dtype == torch.uint8 and host.item_size == 24


@pytest.mark.parametrize(
    ("ratio", "gb", "page_size", "expected"),
    [
        (2.0, 0, 16, 128),
        (1.3, 0, 16, 96),  # 83.2 slots rounded up to whole pages
        (3.0, 0, 1, 192),
        (0, 100 * 96 * 2 / 1e9, 16, 112),  # 100 slots of 192 bytes, rounded up
        (0.5, 100 * 96 * 2 / 1e9, 1, 100),  # host_size_gb wins over the ratio
    ],
)
def test_sizing(ratio: float, gb: float, page_size: int, expected: int) -> None:
    device = mha_pool(page_size=page_size)
    host = MHATokenToKVPoolHost(device, ratio, gb, page_size, "layer_first")
    assert host.size == expected and host.available_size() == expected


@pytest.mark.parametrize(("ratio", "gb"), [(0, 0), (0, 1e-9), (1e-6, 0)])
def test_host_of_no_page_is_refused(ratio: float, gb: float) -> None:
    with pytest.raises(ValueError, match="at least one page"):
        MHATokenToKVPoolHost(mha_pool(), ratio, gb, 16, "layer_first")


@pytest.mark.parametrize("ratio", [1.0, 0.5, 0.25])
def test_host_not_larger_than_device_is_built(ratio: float) -> None:
    device = mha_pool()
    host = MHATokenToKVPoolHost(device, ratio, 0, 16, "layer_first")
    assert 0 < host.size <= device.size and host.size % 16 == 0


def _fake_ram(monkeypatch: pytest.MonkeyPatch, available: int, reserve_gb: float) -> None:
    vm = SimpleNamespace(available=available)
    monkeypatch.setattr(host_layouts.psutil, "virtual_memory", lambda: vm)
    env = dataclasses.replace(host_layouts.ENV, host_ram_reserve_gb=reserve_gb)
    monkeypatch.setattr(host_layouts, "ENV", env)

    def no_allocation(self: HostKVPool) -> torch.Tensor:
        raise AssertionError("allocated before the RAM check")

    monkeypatch.setattr(HostKVPool, "_allocate", no_allocation)


def test_ram_refusal_before_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_ram(monkeypatch, available=10_000, reserve_gb=0)
    with pytest.raises(ValueError, match="RAM"):  # 128 slots * 192 B = 24576 B > 10000 B
        MHATokenToKVPoolHost(mha_pool(), 2.0, 0, 16, "layer_first")


def test_ram_reserve_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_ram(monkeypatch, available=int(2e9), reserve_gb=1.99999)
    with pytest.raises(ValueError, match="HICACHE_HOST_RAM_RESERVE_GB"):
        MHATokenToKVPoolHost(mha_pool(), 2.0, 0, 16, "layer_first")


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"layout": "row_major"}, ValueError, "layout"),
        ({"layout": "page_first", "io_backend": "direct"}, ValueError, "io_backend"),
        ({"layout": "page_first_direct", "io_backend": "kernel"}, ValueError, "io_backend"),
        ({"layout": "page_head", "io_backend": "direct"}, ValueError, "io_backend"),
        ({"io_backend": "dma"}, ValueError, "io_backend"),
        ({"page_size": 8}, ValueError, "page_size"),
        ({"host_to_device_ratio": -1.0}, ValueError, "host_to_device_ratio"),
        ({"host_size_gb": "1"}, ValueError, "host_size_gb"),
    ],
)
def test_bad_construction_names_argument(kwargs: dict, error: type, name: str) -> None:
    args = {"host_to_device_ratio": 2.0, "host_size_gb": 0, "page_size": 16}
    args |= {"layout": "layer_first"} | kwargs
    with pytest.raises(error, match=name):
        MHATokenToKVPoolHost(mha_pool(), **args)


def test_mla_has_no_page_head_and_pool_kinds_must_match() -> None:
    with pytest.raises(ValueError, match="layout"):
        MLATokenToKVPoolHost(mla_pool(), 2.0, 0, 16, "page_head")
    with pytest.raises(TypeError, match="device_pool"):
        MLATokenToKVPoolHost(mha_pool(), 2.0, 0, 16, "layer_first")
    pairs = MLATokenToKVPoolHost(mla_pool(), 2.0, 0, 16, "page_first", io_backend="kernel")
    assert pairs.layout == "page_first"


def test_host_alloc_free_accounting() -> None:
    host = MHATokenToKVPoolHost(mha_pool(), 2.0, 0, 16, "page_first")
    a = host.alloc(64)
    assert a.device.type == "cpu" and a.dtype == torch.int64
    assert int(a.min()) == 0  # no reserved page on the host
    with pytest.raises(ValueError, match="page_size"):
        host.alloc(20)
    b = host.alloc(64)
    assert host.alloc(16) is None and host.available_size() == 0
    assert host.free(a) == 64 and host.available_size() == 64
    with pytest.raises(ValueError, match="double free"):
        host.free(a[:16])
    assert host.available_size() == 64
    assert host.free_slots().tolist() == sorted(a.tolist())
    host.free(b)
    host.check_invariants()
    host.alloc(32)
    host.clear()
    assert host.available_size() == 128


def test_close_is_idempotent_and_blocks_transfers() -> None:
    device = mha_pool()
    host = MHATokenToKVPoolHost(device, 2.0, 0, 16, "layer_first")
    host.close()
    host.close()
    idx = torch.arange(16)
    with pytest.raises(RuntimeError, match="closed"):
        host.backup_from_device_all_layer(device, idx, idx + 16, "kernel")


def test_pool_is_collected() -> None:
    host = MHATokenToKVPoolHost(mha_pool(), 2.0, 0, 16, "layer_first")
    ref = weakref.ref(host)
    del host
    gc.collect()
    assert ref() is None
