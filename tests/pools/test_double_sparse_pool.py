"""DoubleSparseTokenToKVPool: K, V and heavy-channel labels set/get byte-exact; misuse."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import DoubleSparseTokenToKVPool, MHATokenToKVPool, MHATokenToKVPoolHost
from tests.pools.helpers import DEVICES, DTYPES, POISON, as_bytes, fill_random, poison, random_like

H, D, C = 2, 8, 3  # heads, head dim, heavy channels


def ds_pool(dtype: torch.dtype = torch.float16, device: str = "cpu") -> DoubleSparseTokenToKVPool:
    return DoubleSparseTokenToKVPool(64, 16, dtype, H, D, 2, device, C)


def inputs(n: int, dtype: torch.dtype, device: str, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(n, H, D), (n, H, D), (n, H, C)]
    return [random_like(torch.empty(s, dtype=dtype), gen).to(device) for s in shapes]


def all_buffers(pool: DoubleSparseTokenToKVPool) -> list[torch.Tensor]:
    return [*pool.k_buffer, *pool.v_buffer, *pool.label_buffer]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_set_get_byte_exact(dtype: torch.dtype, device: str) -> None:
    pool = ds_pool(dtype, device)
    assert isinstance(pool, MHATokenToKVPool) and pool.kind == "DoubleSparse"
    assert pool.label_buffer[1].shape == (80, H, C)
    assert pool.label_buffer[1].dtype == pool.store_dtype
    assert dict(pool.geometry.dims)["heavy_channel_num"] == C
    for buf in all_buffers(pool):
        poison(buf)
    loc = torch.tensor([16, 79, 40, 17], device=device)
    k, v, label = inputs(4, dtype, device)
    pool.set_kv_buffer(1, loc, k, v, label)
    got_k, got_v = pool.get_kv_buffer(1)
    got_label = pool.get_label_buffer(1)
    assert got_label.dtype == dtype and got_label.shape == (80, H, C)
    for got, want in ((got_k, k), (got_v, v), (got_label, label)):
        expected = torch.full_like(as_bytes(got), POISON)
        expected[loc] = as_bytes(want)
        assert torch.equal(as_bytes(got), expected)  # written rows, and nothing else
    assert all((as_bytes(b) == POISON).all() for b in (pool.label_buffer[0], pool.k_buffer[0]))


def test_label_getter_waits_on_the_counter() -> None:
    pool = ds_pool()
    waits: list[int] = []

    class Counter:
        def wait_until(self, layer_id: int) -> None:
            waits.append(layer_id)

    pool.register_layer_transfer_counter(Counter())
    pool.get_label_buffer(1)
    pool.get_key_buffer(0)
    assert waits == [1, 0]


def test_fp8_labels_cast_wider_inputs() -> None:
    pool = ds_pool(torch.float8_e4m3fn)
    loc = torch.tensor([20, 21])
    k, v, label = (torch.randn(2, H, d, dtype=torch.bfloat16) for d in (D, D, C))
    pool.set_kv_buffer(0, loc, k, v, label)
    want = as_bytes(label.to(torch.float8_e4m3fn))
    assert torch.equal(as_bytes(pool.get_label_buffer(0)[loc]), want)


MISUSE = [
    ({"layer_id": 2}, ValueError, "layer_id"),
    ({"loc": torch.tensor([16, 80])}, ValueError, "loc"),
    ({"cache_k": torch.zeros(2, H, D + 1, dtype=torch.float16)}, ValueError, "cache_k"),
    ({"cache_v": torch.zeros(2, H, D, dtype=torch.float32)}, TypeError, "cache_v"),
    ({"cache_label": torch.zeros(2, H, C + 1, dtype=torch.float16)}, ValueError, "cache_label"),
    ({"cache_label": torch.zeros(2, H, C, dtype=torch.bfloat16)}, TypeError, "cache_label"),
    ({"cache_label": None}, TypeError, "cache_label"),
]


@pytest.mark.parametrize("bad, exc, name", MISUSE, ids=[f"{m[2]}{i}" for i, m in enumerate(MISUSE)])
def test_misuse_writes_nothing(bad: dict, exc: type, name: str) -> None:
    pool = ds_pool()
    fill_random(all_buffers(pool))
    before = [b.clone() for b in all_buffers(pool)]
    k, v, label = inputs(2, torch.float16, "cpu")
    args = {"layer_id": 0, "loc": torch.tensor([16, 17]), "cache_k": k, "cache_v": v}
    args["cache_label"] = label
    with pytest.raises(exc, match=name):
        pool.set_kv_buffer(**{**args, **bad})
    assert all(
        torch.equal(as_bytes(a), as_bytes(b))
        for a, b in zip(before, all_buffers(pool), strict=True)
    )
    pool.set_kv_buffer(**args)
    assert torch.equal(as_bytes(pool.get_label_buffer(0)[16:18]), as_bytes(label))


@pytest.mark.parametrize("heavy, exc", [(0, ValueError), (2.0, TypeError), (None, TypeError)])
def test_constructor_rejects_bad_heavy_channel_num(heavy: object, exc: type) -> None:
    with pytest.raises(exc, match="heavy_channel_num"):
        DoubleSparseTokenToKVPool(64, 16, torch.float16, H, D, 2, "cpu", heavy)  # type: ignore[arg-type]


def test_host_pool_refuses_double_sparse() -> None:
    with pytest.raises(TypeError, match="MHATokenToKVPool of kind 'MHA'.*kind 'DoubleSparse'"):
        MHATokenToKVPoolHost(ds_pool(), 2.0, 0, 16, "layer_first")


@pytest.mark.parametrize("device", DEVICES)
def test_whole_pool_ops_carry_labels(device: str) -> None:
    pool = ds_pool(device=device)
    assert pool.row_buffers[2] is pool.label_buffer
    fill_random(all_buffers(pool), seed=4)
    labels = [b.clone() for b in pool.label_buffer]
    tgt, src = torch.tensor([16, 30], device=device), torch.tensor([30, 70], device=device)
    pool.move_kv_cache(tgt, src)
    for buf, old in zip(pool.label_buffer, labels, strict=True):
        assert torch.equal(as_bytes(buf[tgt]), as_bytes(old[src]))
    copy = pool.get_cpu_copy(src)
    for buf in all_buffers(pool):
        poison(buf)
    pool.load_cpu_copy(copy, src)
    assert torch.equal(as_bytes(pool.label_buffer[1][src]), as_bytes(labels[1][[70, 70]]))
    k, v, label = (80 * H * d * 2 * 2 for d in (D, D, C))  # slots * H * dim * fp16 * layers
    assert pool.get_kv_size_bytes() == (k + label, v)
