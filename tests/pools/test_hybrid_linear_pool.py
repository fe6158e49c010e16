"""HybridLinearKVPool: full-attention layer mapping, linear ids refused, mamba state infos."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import HybridLinearKVPool, MambaPool, MambaStateParams
from tests.pools.helpers import DEVICES, as_bytes, fill_random, poison, random_like

SIZE, PAGE, HEADS, DIM = 8, 2, 2, 4
FULL_IDS, LINEAR_IDS = [3, 7], [0, 1, 2, 4, 5, 6]


class FakeCounter:
    def __init__(self) -> None:
        self.waits: list[int] = []

    def wait_until(self, layer_id: int) -> None:
        self.waits.append(layer_id)


def mamba(device: str = "cpu") -> MambaPool:
    params = MambaStateParams(layers=LINEAR_IDS, conv=[(4, 3)], temporal=(2, 2, 4))
    return MambaPool(size=2, cache_params=params, device=device)


def make(device: str = "cpu", **kwargs: object) -> HybridLinearKVPool:
    args: dict[str, object] = {
        "size": SIZE, "dtype": torch.float16, "page_size": PAGE, "head_num": HEADS,
        "head_dim": DIM, "full_attention_layer_ids": FULL_IDS, "device": device,
        "mamba_pool": mamba(device),
    }  # fmt: skip
    return HybridLinearKVPool(**(args | kwargs))  # type: ignore[arg-type]


def poisoned(pool: HybridLinearKVPool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    bufs = [b for kind in pool.full_kv_pool.row_buffers for b in kind]
    for b in bufs:
        poison(b)
    return bufs, [b.clone() for b in bufs]


def same(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return all(torch.equal(as_bytes(g), as_bytes(w)) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("device", DEVICES)
def test_full_layers_map_to_the_inner_pool(device: str) -> None:
    pool = make(device)
    inner = pool.full_kv_pool
    assert pool.full_attention_layer_id_mapping == {3: 0, 7: 1}
    assert (inner.size, inner.layer_num, inner.page_size) == (SIZE, 2, PAGE)
    for layer, index in pool.full_attention_layer_id_mapping.items():
        k, v = pool.get_kv_buffer(layer)
        assert (
            k.data_ptr()
            == pool.get_key_buffer(layer).data_ptr()
            == inner.k_buffer[index].data_ptr()
        )
        assert (
            v.data_ptr()
            == pool.get_value_buffer(layer).data_ptr()
            == inner.v_buffer[index].data_ptr()
        )


@pytest.mark.parametrize("device", DEVICES)
def test_write_through_a_full_layer_lands_at_its_inner_layer_only(device: str) -> None:
    pool = make(device)
    bufs, want = poisoned(pool)
    loc = torch.tensor([2, 9, 5], device=device)
    gen = torch.Generator().manual_seed(0)
    k = random_like(torch.empty(3, HEADS, DIM, dtype=torch.float16, device=device), gen)
    v = random_like(k, gen)
    pool.set_kv_buffer(7, loc, k, v)  # bufs: k0 k1 v0 v1
    want[1][loc], want[3][loc] = k, v
    assert same(bufs, want)


def test_mla_inner_pool() -> None:
    pool = make(use_mla=True, kv_lora_rank=8, qk_rope_head_dim=4)
    assert pool.full_kv_pool.kind == "MLA" and pool.use_mla
    bufs, want = poisoned(pool)
    loc = torch.tensor([3, 4])
    kv = random_like(torch.empty(2, 1, 12, dtype=torch.float16), torch.Generator().manual_seed(1))
    pool.set_kv_buffer(3, loc, kv)
    want[0][loc] = kv
    assert same(bufs, want)
    assert pool.get_kv_size_bytes() == sum(b.nbytes for b in bufs)


@pytest.mark.parametrize("layer_id", [0, 4, 8, -1])
def test_linear_or_unknown_layer_id_is_a_value_error_naming_it(layer_id: int) -> None:
    pool = make()
    bufs, want = poisoned(pool)
    k = torch.ones(1, HEADS, DIM, dtype=torch.float16)
    for call in (pool.get_key_buffer, pool.get_value_buffer, pool.get_kv_buffer):
        with pytest.raises(ValueError, match="layer_id"):
            call(layer_id)
    with pytest.raises(ValueError, match="layer_id"):
        pool.set_kv_buffer(layer_id, torch.tensor([2]), k, k)
    with pytest.raises(TypeError, match="layer_id"):
        pool.get_key_buffer(3.0)  # type: ignore[arg-type]
    assert same(bufs, want)


def test_getters_wait_on_the_global_layer_id() -> None:
    pool = make(start_layer=2)
    counter = FakeCounter()
    pool.register_layer_transfer_counter(counter)
    pool.get_key_buffer(7)
    pool.get_kv_buffer(3)
    assert counter.waits == [5, 1]
    assert pool.full_kv_pool.layer_transfer_counter is None


def test_buf_infos_sizes_and_moves_come_from_the_right_pool() -> None:
    pool = make()
    assert pool.get_state_buf_infos() == pool.mamba_pool.get_contiguous_buf_infos()
    assert pool.get_contiguous_buf_infos() == pool.full_kv_pool.get_contiguous_buf_infos()
    inner = pool.full_kv_pool
    k, v = sum(b.nbytes for b in inner.k_buffer), sum(b.nbytes for b in inner.v_buffer)
    assert pool.get_kv_size_bytes() == (k, v) and pool.mem_usage == (k + v) / 2**30
    bufs = [b for kind in inner.row_buffers for b in kind]
    fill_random(bufs, seed=2)
    tgt, src = torch.tensor([2, 3, 9]), torch.tensor([3, 9, 2])
    want = [b.clone() for b in bufs]
    for w in want:
        w[tgt] = w.clone()[src]
    pool.move_kv_cache(tgt, src)
    assert same(bufs, want)
    copy = pool.get_cpu_copy(tgt)
    for b in bufs:
        poison(b)
    pool.load_cpu_copy(copy, tgt)
    assert all(
        torch.equal(as_bytes(b[tgt]), as_bytes(w[tgt])) for b, w in zip(bufs, want, strict=True)
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"full_attention_layer_ids": []}, ValueError, "full_attention_layer_ids"),
        ({"full_attention_layer_ids": [3, 4]}, ValueError, "linear"),
        ({"full_attention_layer_ids": [3, True]}, TypeError, "full_attention_layer_ids"),
        ({"mamba_pool": object()}, TypeError, "mamba_pool"),
        ({"use_mla": 1}, TypeError, "use_mla"),
        ({"use_mla": True}, TypeError, "kv_lora_rank"),
        ({"start_layer": -1}, ValueError, "start_layer"),
        ({"full_kv_pool_class": int}, TypeError, "full_kv_pool_class"),
        ({"size": 7}, ValueError, "size"),
    ],
)
def test_constructor_misuse(kwargs: dict[str, object], error: type, name: str) -> None:
    with pytest.raises(error, match=name):
        make(**kwargs)
