"""FP4 device pools: set quantizes, getters dequantize within the bound, other rows untouched."""

from __future__ import annotations

import pytest
import torch

from hicache.kernels.fp4 import dequantize_fp4, quantize_fp4
from hicache.pools import (
    MHATokenToKVPool,
    MHATokenToKVPoolFP4,
    MHATokenToKVPoolHost,
    MLATokenToKVPoolFP4,
    MLATokenToKVPoolHost,
)
from tests.pools.helpers import DEVICES, POISON, poison, skip_without_triton

SIZE, PAGE, LAYERS = 32, 16, 2


def mha_fp4(device: str = "cpu", dtype: torch.dtype = torch.bfloat16, **kw) -> MHATokenToKVPoolFP4:
    return MHATokenToKVPoolFP4(SIZE, PAGE, dtype, 2, 32, LAYERS, device, **kw)


def mla_fp4(device: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> MLATokenToKVPoolFP4:
    return MLATokenToKVPoolFP4(SIZE, PAGE, dtype, 16, 16, LAYERS, device)


def rand(shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int) -> torch.Tensor:
    """Normal values with a random power-of-two magnitude per 16-value block."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen).reshape(-1, 16)
    x *= torch.exp2(torch.randint(-8, 9, (x.shape[0], 1), generator=gen).float())
    return x.reshape(shape).to(dtype).to(device)


def poisoned(pool) -> None:
    for kind in pool.row_buffers:
        for buf in kind:
            poison(buf)


def loc_on(device: str) -> torch.Tensor:
    return torch.tensor([20, 17, 33, 46, 18], device=device)  # unordered, in [PAGE, SIZE + PAGE)


def check_written(data, scales, loc, cache) -> None:
    """Rows ``loc`` hold ``cache`` quantized; every other row is still poison."""
    packed, scale = quantize_fp4(cache)
    assert torch.equal(data[loc], packed)
    assert torch.equal(scales[loc], scale.reshape(loc.numel(), -1))
    rest = torch.ones(data.shape[0], dtype=torch.bool)
    rest[loc.cpu()] = False
    assert (data[rest.to(data.device)] == POISON).all()
    assert (scales[rest.to(data.device)] == POISON).all()


def check_read(got, loc, cache, scales) -> None:
    """``got[loc]`` is ``cache`` within the format's bound ``|x - x_hat| <= s`` (per block)."""
    s = torch.exp2(scales[loc].double() - 127).repeat_interleave(16, dim=-1).view(cache.shape)
    err = (got[loc].double() - cache.double()).abs()
    assert (err <= s).all() and (err > 0).any()
    assert torch.equal(got[loc], dequantize_fp4(*quantize_fp4(cache), got.dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mha_set_then_get_within_the_bound(device, dtype):
    pool = mha_fp4(device, dtype, v_head_dim=16)
    poisoned(pool)
    loc = loc_on(device)
    k, v = rand((5, 2, 32), dtype, device, 0), rand((5, 2, 16), dtype, device, 1)
    pool.set_kv_buffer(1, loc, k, v)
    check_written(pool.k_buffer[1], pool.k_scale_buffer[1], loc, k)
    check_written(pool.v_buffer[1], pool.v_scale_buffer[1], loc, v)
    assert all((buf == POISON).all() for kind in pool.row_buffers for buf in kind[:1])
    keys, values = pool.get_kv_buffer(1)
    assert keys.shape == (SIZE + PAGE, 2, 32) and values.shape == (SIZE + PAGE, 2, 16)
    assert keys.dtype == dtype and keys.device == pool.device
    check_read(keys, loc, k, pool.k_scale_buffer[1])
    check_read(values, loc, v, pool.v_scale_buffer[1])
    assert torch.equal(pool.get_key_buffer(1), keys)
    assert torch.equal(pool.get_value_buffer(1), values)


@pytest.mark.parametrize("device", DEVICES)
def test_mla_set_then_get_within_the_bound(device):
    pool = mla_fp4(device)
    poisoned(pool)
    loc = loc_on(device)
    kv = rand((5, 1, 32), torch.bfloat16, device, 2)
    pool.set_kv_buffer(0, loc, kv)
    check_written(pool.kv_buffer[0], pool.kv_scale_buffer[0], loc, kv)
    assert (pool.kv_buffer[1] == POISON).all() and (pool.kv_scale_buffer[1] == POISON).all()
    latent, value = pool.get_kv_buffer(0)
    check_read(latent, loc, kv, pool.kv_scale_buffer[0])
    assert torch.equal(value, latent[..., :16]) and value.shape == (SIZE + PAGE, 1, 16)
    assert torch.equal(pool.get_key_buffer(0), latent)
    assert torch.equal(pool.get_value_buffer(0), value)


def test_buffers_have_sglangs_shapes_and_row_buffers_hold_the_scales():
    pool = mha_fp4()
    m = SIZE + PAGE
    assert pool.store_dtype == torch.uint8 and pool.dtype == torch.bfloat16
    assert [b.shape for b in (pool.k_buffer[0], pool.k_scale_buffer[0])] == [(m, 2, 16), (m, 4)]
    assert all(b.dtype == torch.uint8 for kind in pool.row_buffers for b in kind)
    assert pool.row_buffers == [
        pool.k_buffer,
        pool.v_buffer,
        pool.k_scale_buffer,
        pool.v_scale_buffer,
    ]
    assert pool.part_buffers == [pool.k_buffer, pool.v_buffer]
    assert pool.item_size == 2 * 32 // 2 and pool.geometry.kind == "MHA_FP4"
    assert pool.k_data_ptrs.tolist() == [b.data_ptr() for b in pool.k_buffer]
    mla = mla_fp4()
    assert [b.shape for b in (mla.kv_buffer[0], mla.kv_scale_buffer[0])] == [(m, 1, 16), (m, 2)]
    assert mla.row_buffers == [mla.kv_buffer, mla.kv_scale_buffer] and mla.item_size == 16
    assert mla.geometry.kind == "MLA_FP4"
    # unwritten rows (scale byte 0) read back as zeros
    assert not pool.get_key_buffer(0).any() and not mla.get_key_buffer(0).any()


class Recorder:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def wait_until(self, layer_id: int) -> None:
        self.calls.append(layer_id)


def test_getters_wait_on_the_layer_counter_with_local_ids():
    pool, mla = mha_fp4(start_layer=4), mla_fp4()
    for p in (pool, mla):
        p.register_layer_transfer_counter(Recorder())
    pool.get_key_buffer(5), pool.get_value_buffer(4), pool.get_kv_buffer(5)
    mla.get_key_buffer(1), mla.get_value_buffer(0), mla.get_kv_buffer(1)
    assert pool.layer_transfer_counter.calls == [1, 0, 1]
    assert mla.layer_transfer_counter.calls == [1, 0, 1]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dtype": torch.float8_e4m3fn}, TypeError, "dtype must be one of"),
        ({"head_dim": 24}, ValueError, "head_dim must be a multiple of 16"),
        ({"v_head_dim": 8}, ValueError, "v_head_dim must be a multiple of 16"),
    ],
)
def test_constructor_misuse(kwargs, error, match):
    args = {"dtype": torch.bfloat16, "head_num": 2, "head_dim": 32, "layer_num": 1}
    args.update(kwargs)
    v_head_dim = args.pop("v_head_dim", None)
    with pytest.raises(error, match=match):
        MHATokenToKVPoolFP4(SIZE, PAGE, device="cpu", v_head_dim=v_head_dim, **args)


def test_mla_constructor_needs_a_latent_of_whole_blocks():
    with pytest.raises(ValueError, match="kv_lora_rank \\+ qk_rope_head_dim must be"):
        MLATokenToKVPoolFP4(SIZE, PAGE, torch.bfloat16, 16, 8, 1, "cpu")


def test_set_misuse_raises_before_writing_anything():
    pool = mha_fp4()
    poisoned(pool)
    loc = loc_on("cpu")
    k, v = rand((5, 2, 32), torch.bfloat16, "cpu", 3), rand((5, 2, 32), torch.bfloat16, "cpu", 4)
    bad = [
        ((0, loc, k, v[:4]), ValueError, "cache_v must have shape"),
        ((0, loc, k, v.to(torch.int32)), TypeError, "cache_v must have dtype"),
        ((0, loc, k, v.double()), TypeError, "cache_v must have dtype"),
        ((0, loc, k.tolist(), v), TypeError, "cache_k must be a torch.Tensor"),
        ((0, loc + 100, k, v), ValueError, "loc must lie in"),
        ((2, loc, k, v), ValueError, "layer_id must be in"),
    ]
    for args, error, match in bad:
        with pytest.raises(error, match=match):
            pool.set_kv_buffer(*args)
    assert all((buf == POISON).all() for kind in pool.row_buffers for buf in kind)
    mla = mla_fp4()
    poisoned(mla)
    with pytest.raises(ValueError, match="cache_kv must have shape"):
        mla.set_kv_buffer(0, loc, k)
    assert all((buf == POISON).all() for kind in mla.row_buffers for buf in kind)


def test_the_host_tier_refuses_fp4_pools():
    with pytest.raises(TypeError, match="kind 'MHA'.*MHATokenToKVPoolFP4 of kind 'MHA_FP4'"):
        MHATokenToKVPoolHost(mha_fp4(), 2.0, 0, PAGE, "layer_first")
    with pytest.raises(TypeError, match="kind 'MLA'.*of kind 'MLA_FP4'"):
        MLATokenToKVPoolHost(mla_fp4(), 2.0, 0, PAGE, "layer_first")
    plain = MHATokenToKVPool(SIZE, PAGE, torch.bfloat16, 2, 32, LAYERS, "cpu")
    host = MHATokenToKVPoolHost(plain, 2.0, 0, PAGE, "layer_first")
    slots = torch.arange(PAGE, 2 * PAGE)
    with pytest.raises(ValueError, match="kind: host pool MHA, device pool MHA_FP4"):
        host.load_to_device_per_layer(mha_fp4(), slots - PAGE, slots, 0, "kernel")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("make", [mha_fp4, mla_fp4])
def test_move_kv_cache_moves_codes_and_scales(make, native, device):
    if not native:
        skip_without_triton(device)
    pool = make(device)
    pool.use_native_move_kv_cache = native
    poisoned(pool)
    src, tgt = loc_on(device), torch.tensor([40, 20, 21, 47, 16], device=device)  # overlapping
    shape = (5, 2, 32) if isinstance(pool, MHATokenToKVPoolFP4) else (5, 1, 32)
    for layer in range(LAYERS):
        caches = [rand(shape, torch.bfloat16, device, 10 * layer + i) for i in range(2)]
        pool.set_kv_buffer(layer, src, *caches[: len(pool.part_buffers)])
    before = [buf.clone() for kind in pool.row_buffers for buf in kind]
    want_keys = [pool.get_key_buffer(layer)[src] for layer in range(LAYERS)]
    pool.move_kv_cache(tgt, src)
    for old, new in zip(before, (buf for kind in pool.row_buffers for buf in kind), strict=True):
        expect = old.clone()
        expect[tgt] = old[src]
        assert torch.equal(new, expect)
    for layer in range(LAYERS):
        assert torch.equal(pool.get_key_buffer(layer)[tgt], want_keys[layer])


def test_cpu_copy_round_trip_and_sizes_cover_the_scales():
    pool = mha_fp4()
    loc = loc_on("cpu")
    pool.set_kv_buffer(
        0, loc, rand((5, 2, 32), torch.float32, "cpu", 5), rand((5, 2, 32), torch.float32, "cpu", 6)
    )
    want = pool.get_kv_buffer(0)
    copy = pool.get_cpu_copy(loc)
    assert len(copy[0][0]) == 4  # k, v, k_scale, v_scale
    for kind in pool.row_buffers:
        for buf in kind:
            poison(buf)
    pool.load_cpu_copy(copy, loc)
    got = pool.get_kv_buffer(0)
    assert all(torch.equal(g[loc], w[loc]) for g, w in zip(got, want, strict=True))
    m = SIZE + PAGE
    assert pool.get_kv_size_bytes() == (LAYERS * m * (32 + 4), LAYERS * m * (32 + 4))
    assert mla_fp4().get_kv_size_bytes() == LAYERS * m * (16 + 2)
