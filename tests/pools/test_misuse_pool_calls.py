"""Issue 12, the pools' and allocators' public calls: every bad argument raises, naming it, with
free counts and invariants unchanged, and a normal call works afterwards."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hicache.pools import (
    MHATokenToKVPool,
    MHATokenToKVPoolHost,
    TokenToKVPoolAllocator,
)

PAGE = 2


def device_pool() -> MHATokenToKVPool:
    return MHATokenToKVPool(8, PAGE, torch.float16, 2, 8, 2, "cpu")


def host_pool(layout: str = "layer_first") -> MHATokenToKVPoolHost:
    return MHATokenToKVPoolHost(device_pool(), 2.0, 0, PAGE, layout)


def slot_pools():
    """Both slot allocators: the device one, and a host pool (its page allocator inside)."""
    return {"device": TokenToKVPoolAllocator(8, PAGE, "cpu"), "host": host_pool()}


BAD_N = [
    (True, TypeError),
    (2.0, TypeError),
    ("2", TypeError),
    (None, TypeError),
    (np.int64(2), TypeError),
    (-2, ValueError),
    (3, ValueError),
]


@pytest.mark.parametrize("n, exc", BAD_N, ids=[repr(n) for n, _ in BAD_N])
@pytest.mark.parametrize("which", ["device", "host"])
def test_alloc_rejects_bad_n(which, n, exc):
    pool = slot_pools()[which]
    free = pool.available_size()
    with pytest.raises(exc, match="n must"):
        pool.alloc(n)
    assert pool.available_size() == free
    assert pool.alloc(PAGE) is not None


def _bad_frees(held: torch.Tensor, freed: torch.Tensor, lo: int, hi: int):
    return [
        (torch.tensor([lo - PAGE, lo - PAGE + 1]), ValueError),  # below the first usable slot
        (torch.tensor([hi, hi + 1]), ValueError),
        (torch.tensor([-2, -1]), ValueError),
        (torch.cat([held, held]), ValueError),  # repeated
        (freed, ValueError),  # double free
        (held.double(), TypeError),
        (held.bool(), TypeError),
        (held.to(torch.complex128), TypeError),
        (held[None], ValueError),
        (held.tolist(), TypeError),
        (held.to("meta"), ValueError),  # was torch's NotImplementedError
    ]


@pytest.mark.parametrize("case", range(11))
@pytest.mark.parametrize("which", ["device", "host"])
def test_free_rejects_slots_it_does_not_own(which, case):
    pool = slot_pools()[which]
    held, freed = pool.alloc(PAGE), pool.alloc(PAGE)
    pool.free(freed)
    lo = PAGE if which == "device" else 0
    hi = 8 + lo if which == "device" else pool.size
    indices, exc = _bad_frees(held, freed, lo, hi)[case]
    free = pool.available_size()
    with pytest.raises(exc, match="indices"):
        pool.free(indices)
    assert pool.available_size() == free
    pool.check_invariants()
    assert pool.free(held) == PAGE


@pytest.mark.parametrize(
    "kwargs",
    [
        {"host_to_device_ratio": math.inf},
        {"host_size_gb": math.inf},
        {"host_to_device_ratio": math.nan},
    ],
    ids=str,
)
def test_host_pool_rejects_infinite_sizes(kwargs):
    args = {"host_to_device_ratio": 2.0, "host_size_gb": 0} | kwargs
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        MHATokenToKVPoolHost(
            device_pool(), args["host_to_device_ratio"], args["host_size_gb"], PAGE, "layer_first"
        )


@pytest.mark.parametrize("pin", ["no", 0, None])
def test_host_pool_pin_memory_must_be_a_bool(pin):
    with pytest.raises(TypeError, match="pin_memory"):
        MHATokenToKVPoolHost(device_pool(), 2.0, 0, PAGE, "layer_first", pin_memory=pin)


def _transfer(host, dev, h, d, backup: bool, backend: str) -> None:
    if backup:
        host.backup_from_device_all_layer(dev, h, d, backend)
    else:
        host.load_to_device_per_layer(dev, h, d, 0, backend)


@pytest.mark.parametrize("backup", [True, False], ids=["backup", "load"])
@pytest.mark.parametrize(
    "layout, backend",
    [("layer_first", "kernel"), ("page_first", "kernel"), ("layer_first", "direct")],
)
@pytest.mark.parametrize(
    "bad, exc, name",
    [
        (lambda h, d: (h.int(), d), TypeError, "host_indices"),
        (lambda h, d: (h, d.double()), TypeError, "device_indices"),
        (lambda h, d: (h[None], d), ValueError, "host_indices"),
        (lambda h, d: (h, d[:1]), ValueError, "equally long"),
        (lambda h, d: (h - 10, d), IndexError, "host_indices"),
        (lambda h, d: (h, d + 100), IndexError, "device_indices"),
    ],
    ids=["int32", "float", "2d", "lengths", "negative", "past_end"],
)
def test_host_pool_transfers_check_their_indices(layout, backend, backup, bad, exc, name):
    host = host_pool(layout)
    dev = host.device_pool
    h, d = host.alloc(PAGE), torch.arange(PAGE, 2 * PAGE)
    targets = [t.view(torch.uint8).clone() for t in (host.kv_buffer, *dev.k_buffer, *dev.v_buffer)]
    with pytest.raises(exc, match=name):
        _transfer(host, dev, *bad(h, d), backup, backend)
    after = [t.view(torch.uint8) for t in (host.kv_buffer, *dev.k_buffer, *dev.v_buffer)]
    assert all(torch.equal(x, y) for x, y in zip(targets, after, strict=True))
    _transfer(host, dev, h, d, backup, backend)


@pytest.mark.parametrize("counter", [object(), 3])  # None clears it (SGLang)
def test_register_layer_transfer_counter_needs_wait_until(counter):
    pool = device_pool()
    with pytest.raises(TypeError, match="counter"):
        pool.register_layer_transfer_counter(counter)
    assert pool.layer_transfer_counter is None
    pool.get_key_buffer(1)
