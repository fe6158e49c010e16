"""Device KV pools: buffers, pointer tables, set/get byte-exact, counter waits, bad input."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from hicache.pools import MHATokenToKVPool, MLATokenToKVPool
from tests.pools.helpers import DEVICES, DTYPES, as_bytes, mha_pool, mla_pool, random_like


class FakeCounter:
    def __init__(self) -> None:
        self.waits: list[int] = []

    def wait_until(self, layer_id: int) -> None:
        self.waits.append(layer_id)


def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mha_buffers_and_pointer_tables(dtype: torch.dtype, device: str) -> None:
    pool = mha_pool(dtype=dtype, device=device)
    fp8 = dtype.itemsize == 1
    assert pool.store_dtype == (torch.uint8 if fp8 else dtype)
    assert pool.item_size == 2 * 8 * dtype.itemsize
    assert len(pool.k_buffer) == len(pool.v_buffer) == 3
    assert pool.k_buffer[0].shape == (64 + 16, 2, 8)
    assert pool.k_buffer[0].dtype == pool.store_dtype
    for table, bufs in ((pool.k_data_ptrs, pool.k_buffer), (pool.v_data_ptrs, pool.v_buffer)):
        assert table.dtype == torch.uint64 and table.device.type == device
        assert table.cpu().tolist() == [b.data_ptr() for b in bufs]
    assert pool.get_key_buffer(1).dtype == dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mha_set_get_byte_exact(dtype: torch.dtype, device: str) -> None:
    pool = mha_pool(dtype=dtype, device=device)
    loc = torch.tensor([16, 40, 17, 79], device=device)
    k = random_like(torch.empty(4, 2, 8, dtype=dtype, device=device), gen())
    v = random_like(torch.empty(4, 2, 8, dtype=dtype, device=device), gen())
    pool.set_kv_buffer(2, loc, k, v)
    got_k, got_v = pool.get_kv_buffer(2)
    assert torch.equal(as_bytes(got_k[loc]), as_bytes(k))
    assert torch.equal(as_bytes(pool.get_value_buffer(2)[loc]), as_bytes(v))
    assert torch.equal(as_bytes(pool.get_key_buffer(2)[loc]), as_bytes(k))
    assert not as_bytes(pool.get_key_buffer(1)).any()  # other layers untouched


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mla_set_get_byte_exact(dtype: torch.dtype, device: str) -> None:
    pool = mla_pool(dtype=dtype, device=device)
    assert pool.kv_buffer[0].shape == (80, 1, 24) and pool.item_size == 24 * dtype.itemsize
    assert pool.kv_data_ptrs.cpu().tolist() == [b.data_ptr() for b in pool.kv_buffer]
    loc = torch.tensor([63, 16, 20], device=device)
    kv = random_like(torch.empty(3, 1, 24, dtype=dtype, device=device), gen())
    pool.set_kv_buffer(0, loc, kv)
    assert torch.equal(as_bytes(pool.get_key_buffer(0)[loc]), as_bytes(kv))
    value = pool.get_value_buffer(0)
    assert value.shape == (80, 1, 16) and value.dtype == dtype
    assert torch.equal(as_bytes(value[loc]), as_bytes(kv[..., :16]))
    latent, lora = pool.get_kv_buffer(0)
    assert latent.shape == (80, 1, 24) and lora.shape == (80, 1, 16)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_pool_casts_wider_inputs(dtype: torch.dtype) -> None:
    pool = mha_pool(dtype=dtype)
    loc = torch.tensor([20, 21])
    k = torch.randn(2, 2, 8, dtype=torch.bfloat16)
    pool.set_kv_buffer(0, loc, k, k * 2)
    assert torch.equal(as_bytes(pool.get_key_buffer(0)[loc]), as_bytes(k.to(dtype)))


@pytest.mark.parametrize("make", [mha_pool, mla_pool])
def test_getters_wait_on_registered_counter(make: Callable) -> None:
    pool = make()
    pool.get_key_buffer(0)  # no counter yet: nothing to wait on
    counter = FakeCounter()
    pool.register_layer_transfer_counter(counter)
    pool.get_key_buffer(2)
    pool.get_value_buffer(0)
    pool.get_kv_buffer(1)
    assert counter.waits == [2, 0, 1]
    with pytest.raises(ValueError, match="layer_id"):
        pool.get_key_buffer(3)
    assert counter.waits == [2, 0, 1]


def _mha_args(**bad: object) -> tuple:
    args = {
        "layer_id": 1,
        "loc": torch.tensor([16, 17]),
        "cache_k": torch.ones(2, 2, 8, dtype=torch.float16),
        "cache_v": torch.ones(2, 2, 8, dtype=torch.float16),
    }
    args.update(bad)
    return tuple(args.values())


@pytest.mark.parametrize(
    ("bad", "error", "name"),
    [
        ({"layer_id": 3}, ValueError, "layer_id"),
        ({"layer_id": -1}, ValueError, "layer_id"),
        ({"loc": torch.tensor([16.0, 17.0])}, TypeError, "loc"),
        ({"loc": [16, 17]}, TypeError, "loc"),
        ({"loc": torch.tensor([16, 80])}, ValueError, "loc"),
        ({"cache_k": torch.ones(2, 2, 4, dtype=torch.float16)}, ValueError, "cache_k"),
        ({"cache_v": torch.ones(3, 2, 8, dtype=torch.float16)}, ValueError, "cache_v"),
        ({"cache_v": torch.ones(2, 2, 8, dtype=torch.float32)}, TypeError, "cache_v"),
        ({"cache_k": torch.ones(2, 2, 8, dtype=torch.int16)}, TypeError, "cache_k"),
    ],
)
def test_mha_set_kv_buffer_bad_input_changes_nothing(bad: dict, error: type, name: str) -> None:
    pool = mha_pool()
    with pytest.raises(error, match=name):
        pool.set_kv_buffer(*_mha_args(**bad))
    assert not any(as_bytes(b).any() for b in pool.k_buffer + pool.v_buffer)


def test_mla_set_kv_buffer_bad_input() -> None:
    pool = mla_pool()
    with pytest.raises(ValueError, match="cache_kv"):
        pool.set_kv_buffer(0, torch.tensor([16]), torch.ones(1, 2, 24, dtype=torch.float16))
    with pytest.raises(TypeError, match="cache_kv"):
        pool.set_kv_buffer(0, torch.tensor([16]), torch.ones(1, 1, 24, dtype=torch.bfloat16))
    assert not any(as_bytes(b).any() for b in pool.kv_buffer)


def test_bad_construction_names_argument() -> None:
    with pytest.raises(ValueError, match="size must be a multiple of page_size"):
        MHATokenToKVPool(40, 16, torch.float16, 2, 8, 2, "cpu")
    with pytest.raises(TypeError, match="dtype"):
        MHATokenToKVPool(32, 16, torch.int32, 2, 8, 2, "cpu")
    with pytest.raises(ValueError, match="head_num"):
        MHATokenToKVPool(32, 16, torch.float16, 0, 8, 2, "cpu")
    with pytest.raises(ValueError, match="layer_num"):
        MLATokenToKVPool(32, 16, torch.float16, 16, 8, 0, "cpu")
    with pytest.raises(TypeError, match="kv_lora_rank"):
        MLATokenToKVPool(32, 16, torch.float16, 16.0, 8, 2, "cpu")
