"""SGLang's constructor keywords: v_head_dim, swa_*, start_layer/end_layer, enable_kv_cache_copy."""

from __future__ import annotations

import pytest
import torch

from hicache import env
from hicache.pools import MHATokenToKVPool, MHATokenToKVPoolHost, MLATokenToKVPool
from tests.pools.helpers import DEVICES, as_bytes, poison, random_like


class Counter:
    def __init__(self) -> None:
        self.waits: list[int] = []

    def wait_until(self, layer_id: int) -> None:
        self.waits.append(layer_id)


def _mha(**kw: object) -> MHATokenToKVPool:
    return MHATokenToKVPool(32, 16, torch.bfloat16, 2, 8, 3, "cpu", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("device", DEVICES)
def test_v_head_dim_shapes_and_writes(device: str) -> None:
    pool = MHATokenToKVPool(32, 16, torch.bfloat16, 2, 8, 3, device, v_head_dim=4)
    assert pool.k_buffer[0].shape == (48, 2, 8) and pool.v_buffer[0].shape == (48, 2, 4)
    assert pool.item_size == 2 * 8 * 2 and dict(pool.geometry.dims)["v_head_dim"] == 4
    gen = torch.Generator().manual_seed(5)
    loc = torch.tensor([16, 3, 40], device=device)
    k = random_like(torch.empty(3, 2, 8, dtype=torch.bfloat16, device=device), gen)
    v = random_like(torch.empty(3, 2, 4, dtype=torch.bfloat16, device=device), gen)
    for buf in pool.k_buffer + pool.v_buffer:
        poison(buf)
    pool.set_kv_buffer(1, loc, k, v)
    keys, values = pool.get_kv_buffer(1)
    assert torch.equal(as_bytes(keys[loc]), as_bytes(k))
    assert torch.equal(as_bytes(values[loc]), as_bytes(v))
    with pytest.raises(ValueError, match="cache_v"):
        pool.set_kv_buffer(1, loc, k, k)


def test_swa_keywords_replace_the_dims() -> None:
    pool = _mha(v_head_dim=4, swa_head_num=1, swa_head_dim=16, swa_v_head_dim=12)
    assert (pool.head_num, pool.head_dim, pool.v_head_dim) == (1, 16, 12)
    assert pool.v_buffer[2].shape == (48, 1, 12)
    assert _mha(swa_head_dim=16).v_head_dim == 8  # v_head_dim defaults to head_dim, not swa's


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("v_head_dim", 0, ValueError),
        ("swa_head_num", 1.0, TypeError),
        ("start_layer", -1, ValueError),
        ("end_layer", 3, ValueError),
        ("enable_kv_cache_copy", 1, TypeError),
    ],
)
def test_bad_keyword_names_itself(name: str, value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=name):
        _mha(**{name: value})


@pytest.mark.parametrize(
    "make", [_mha, lambda **kw: MLATokenToKVPool(32, 16, torch.bfloat16, 16, 8, 3, "cpu", **kw)]
)  # type: ignore[arg-type]
def test_start_layer_maps_global_ids(make) -> None:  # type: ignore[no-untyped-def]
    pool = make(start_layer=10, end_layer=12)
    counter = Counter()
    pool.register_layer_transfer_counter(counter)
    assert (pool.start_layer, pool.end_layer) == (10, 12)
    assert pool.get_key_buffer(11).data_ptr() == pool.part_buffers[0][1].data_ptr()
    pool.get_value_buffer(12)
    assert counter.waits == [1, 2]  # the counter numbers layers locally
    for bad in (9, 13, 0):
        with pytest.raises(ValueError, match="layer_id"):
            pool.get_kv_buffer(bad)
    assert counter.waits == [1, 2]


def test_set_kv_buffer_takes_global_ids() -> None:
    pool = _mha(start_layer=4)
    k = torch.ones(1, 2, 8, dtype=torch.bfloat16)
    pool.set_kv_buffer(6, torch.tensor([20]), k, 2 * k)
    assert pool.v_buffer[2][20].eq(2).all() and pool.v_buffer[0][20].eq(0).all()
    with pytest.raises(ValueError, match="layer_id"):
        pool.set_kv_buffer(2, torch.tensor([20]), k, k)


def test_enable_kv_cache_copy_prepares_the_move() -> None:
    if not env.ENV.triton_interpret:
        pytest.skip("the kernel's path on CPU tensors needs TRITON_INTERPRET=1")
    eager = _mha(enable_kv_cache_copy=True)  # the kernel's path on CUDA or the interpreter
    assert (eager._move_table is None) == eager.use_native_move_kv_cache
    pool = _mha()
    assert pool._move_table is None
    pool.use_native_move_kv_cache = False
    pool.move_kv_cache(torch.tensor([17]), torch.tensor([18]))
    assert pool._move_table is not None


def test_host_pool_refuses_another_v_head_dim() -> None:
    with pytest.raises(ValueError, match="v_head_dim"):
        MHATokenToKVPoolHost(_mha(v_head_dim=4), 2.0, 0, 16, "layer_first", pin_memory=False)
    host = MHATokenToKVPoolHost(_mha(v_head_dim=8), 2.0, 0, 16, "layer_first", pin_memory=False)
    assert host.size == 64
