"""SWAKVPool: layer routing, full->SWA translation, writes landing in one pool only, misuse."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import MHATokenToKVPool, MLATokenToKVPool, SWAKVPool, SWATokenToKVPoolAllocator
from tests.pools.helpers import DEVICES, as_bytes, poison, random_like

SIZE, SIZE_SWA, PAGE, HEADS, DIM = 16, 8, 2, 2, 4
FULL_IDS, SWA_IDS = [0, 3], [1, 2, 4]


class FakeCounter:
    def __init__(self) -> None:
        self.waits: list[int] = []

    def wait_until(self, layer_id: int) -> None:
        self.waits.append(layer_id)


def make(device: str = "cpu", **kwargs: object) -> tuple[SWAKVPool, SWATokenToKVPoolAllocator]:
    pool = SWAKVPool(
        SIZE, SIZE_SWA, PAGE, torch.float16, HEADS, DIM, SWA_IDS, FULL_IDS, device, **kwargs
    )
    return pool, SWATokenToKVPoolAllocator(SIZE, SIZE_SWA, PAGE, device, pool)


def poisoned(pool: SWAKVPool) -> list[torch.Tensor]:
    """Poison every buffer of both pools; return them (full pool's first)."""
    bufs = [b for p in pool.inner_pools for kind in p.row_buffers for b in kind]
    for b in bufs:
        poison(b)
    return bufs


def snapshot(bufs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [b.clone() for b in bufs]


def rand_kv(n: int, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    k = random_like(torch.empty(n, HEADS, DIM, dtype=torch.float16, device=device), gen)
    return k, random_like(k, gen)


def assert_same(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert all(torch.equal(as_bytes(g), as_bytes(w)) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("device", DEVICES)
def test_pools_have_their_own_sizes_and_layers(device: str) -> None:
    pool, _ = make(device)
    assert (pool.full_kv_pool.size, pool.full_kv_pool.layer_num) == (SIZE, 2)
    assert (pool.swa_kv_pool.size, pool.swa_kv_pool.layer_num) == (SIZE_SWA, 3)
    assert pool.layer_num == 5 and pool.page_size == PAGE
    assert pool.layers_mapping == {
        0: (0, False),
        3: (1, False),
        1: (0, True),
        2: (1, True),
        4: (2, True),
    }
    for layer, (index, is_swa) in pool.layers_mapping.items():
        inner = pool.swa_kv_pool if is_swa else pool.full_kv_pool
        k, v = pool.get_kv_buffer(layer)
        assert k.data_ptr() == inner.k_buffer[index].data_ptr()
        assert (
            v.data_ptr()
            == pool.get_value_buffer(layer).data_ptr()
            == inner.v_buffer[index].data_ptr()
        )
        assert pool.get_key_buffer(layer).shape[0] == inner.size + PAGE


@pytest.mark.parametrize("device", DEVICES)
def test_swa_write_lands_at_translated_slot_only(device: str) -> None:
    pool, alloc = make(device)
    full = alloc.alloc(4)
    assert full is not None
    swa = pool.translate_loc_from_full_to_swa(full)
    bufs = poisoned(pool)
    want = snapshot(bufs)
    k, v = rand_kv(4, device)
    pool.set_kv_buffer(2, full, k, v)  # SWA layer 2 -> swa pool layer 1
    swa_k, swa_v = pool.swa_kv_pool.k_buffer, pool.swa_kv_pool.v_buffer
    want[4 + 1][swa] = k  # bufs: full k0 k1 v0 v1, swa k0 k1 k2 v0 v1 v2
    want[4 + 3 + 1][swa] = v
    assert_same(bufs, want)
    assert torch.equal(as_bytes(swa_k[1][swa]), as_bytes(k))
    assert torch.equal(as_bytes(swa_v[1][swa]), as_bytes(v))


@pytest.mark.parametrize("device", DEVICES)
def test_full_write_lands_in_full_pool_only(device: str) -> None:
    pool, alloc = make(device)
    full = alloc.alloc(6)
    assert full is not None
    bufs = poisoned(pool)
    want = snapshot(bufs)
    k, v = rand_kv(6, device, seed=1)
    pool.set_kv_buffer(3, full, k, v)  # full layer 3 -> full pool layer 1
    want[1][full], want[3][full] = k, v
    assert_same(bufs, want)


@pytest.mark.parametrize("device", DEVICES)
def test_swa_loc_given_is_used_untranslated(device: str) -> None:
    pool, alloc = make(device)
    full = alloc.alloc(2)
    assert full is not None
    bufs = poisoned(pool)
    want = snapshot(bufs)
    swa_loc = torch.tensor([9, 2], device=device)
    k, v = rand_kv(2, device, seed=2)
    pool.set_kv_buffer(4, full, k, v, swa_loc=swa_loc)
    want[4 + 2][swa_loc], want[4 + 3 + 2][swa_loc] = k, v
    assert_same(bufs, want)


@pytest.mark.parametrize("device", DEVICES)
def test_translation_follows_the_mapping(device: str) -> None:
    pool, alloc = make(device)
    full = alloc.alloc(4)
    assert full is not None
    mapping = alloc.full_to_swa_index_mapping
    assert pool.full_to_swa_index_mapping is mapping
    swa = pool.translate_loc_from_full_to_swa(full)
    assert swa.dtype == torch.int32 and swa.unique().numel() == 4 and bool((swa >= PAGE).all())
    assert torch.equal(swa, mapping[full])
    other = torch.tensor([-1, 0, SIZE + PAGE - 1], device=device, dtype=torch.int32)
    assert pool.translate_loc_from_full_to_swa(other).tolist() == [-1, 0, 0]
    assert torch.equal(alloc.translate_loc_from_full_to_swa(full), swa)


def test_getters_wait_once_on_the_global_layer_id() -> None:
    pool, _ = make()
    inner = FakeCounter()
    pool.full_kv_pool.register_layer_transfer_counter(inner)
    counter = FakeCounter()
    pool.register_layer_transfer_counter(counter)
    pool.get_key_buffer(4)
    pool.get_value_buffer(0)
    pool.get_kv_buffer(3)
    assert counter.waits == [4, 0, 3] and inner.waits == []
    assert all(p.layer_transfer_counter is None for p in pool.inner_pools)
    with pytest.raises(TypeError, match="counter"):
        pool.register_layer_transfer_counter(object())  # type: ignore[arg-type]
    assert pool.layer_transfer_counter is counter


def test_mla_sides_through_pool_kwargs() -> None:
    mla = {"page_size": PAGE, "kv_lora_rank": 8, "qk_rope_head_dim": 4, "device": "cpu"}
    pool = SWAKVPool(
        SIZE, SIZE_SWA, PAGE, torch.float16, 1, 12, SWA_IDS, FULL_IDS, "cpu",
        token_to_kv_pool_class=MLATokenToKVPool,
        full_kv_pool_kwargs=mla, swa_kv_pool_kwargs=mla,
    )  # fmt: skip
    alloc = SWATokenToKVPoolAllocator(SIZE, SIZE_SWA, PAGE, "cpu", pool)
    full = alloc.alloc(2)
    assert full is not None
    bufs = poisoned(pool)
    want = snapshot(bufs)
    kv = random_like(torch.empty(2, 1, 12, dtype=torch.float16), torch.Generator().manual_seed(3))
    pool.set_kv_buffer(1, full, kv)  # SWA layer 1 -> swa pool layer 0 (bufs: full 2, swa 3)
    want[2][pool.translate_loc_from_full_to_swa(full)] = kv
    assert_same(bufs, want)


def test_swa_side_takes_swa_head_keywords() -> None:
    pool, _ = make(swa_head_num=1, swa_head_dim=8)
    assert (pool.swa_kv_pool.head_num, pool.swa_kv_pool.head_dim) == (1, 8)
    assert (pool.full_kv_pool.head_num, pool.full_kv_pool.head_dim) == (HEADS, DIM)


@pytest.mark.parametrize(
    ("layer_id", "error"), [(5, ValueError), (-1, ValueError), ("1", TypeError), (True, TypeError)]
)
def test_bad_layer_id_raises_before_any_write(layer_id: object, error: type) -> None:
    pool, alloc = make()
    full = alloc.alloc(2)
    assert full is not None
    bufs = poisoned(pool)
    want = snapshot(bufs)
    k, v = rand_kv(2, "cpu")
    with pytest.raises(error, match="layer_id"):
        pool.set_kv_buffer(layer_id, full, k, v)  # type: ignore[arg-type]
    with pytest.raises(error, match="layer_id"):
        pool.get_key_buffer(layer_id)  # type: ignore[arg-type]
    assert_same(bufs, want)


@pytest.mark.parametrize(
    ("loc", "error"),
    [
        (torch.tensor([2, SIZE + PAGE]), ValueError),  # past the full pool
        (torch.tensor([2.0, 3.0]), TypeError),
        ([2, 3], TypeError),
    ],
)
@pytest.mark.parametrize("layer_id", [1, 0])
def test_bad_loc_raises_before_any_write(loc: object, error: type, layer_id: int) -> None:
    pool, alloc = make()
    alloc.alloc(4)
    bufs = poisoned(pool)
    want = snapshot(bufs)
    k, v = rand_kv(2, "cpu")
    with pytest.raises(error, match="loc"):
        pool.set_kv_buffer(layer_id, loc, k, v)  # type: ignore[arg-type]
    assert_same(bufs, want)


def test_translation_misuse() -> None:
    pool = SWAKVPool(SIZE, SIZE_SWA, PAGE, torch.float16, HEADS, DIM, SWA_IDS, FULL_IDS, "cpu")
    k, v = rand_kv(1, "cpu")
    with pytest.raises(ValueError, match="full_to_swa_index_mapping"):
        pool.translate_loc_from_full_to_swa(torch.tensor([2]))
    with pytest.raises(ValueError, match="full_to_swa_index_mapping"):
        pool.set_kv_buffer(1, torch.tensor([2]), k, v)
    pool.set_kv_buffer(0, torch.tensor([2]), k, v)  # a full layer needs no mapping
    SWATokenToKVPoolAllocator(SIZE, SIZE_SWA, PAGE, "cpu", pool)
    with pytest.raises(ValueError, match="kv_indices"):
        pool.translate_loc_from_full_to_swa(torch.tensor([-2]))
    with pytest.raises(TypeError, match="kv_indices"):
        pool.translate_loc_from_full_to_swa(torch.tensor([2], dtype=torch.int16))


@pytest.mark.parametrize(
    ("mapping", "error"),
    [
        (torch.zeros(SIZE + PAGE, dtype=torch.int64), ValueError),
        (torch.zeros(SIZE + PAGE + 1, dtype=torch.int32), TypeError),
    ],
)
def test_register_mapping_misuse(mapping: torch.Tensor, error: type) -> None:
    pool, alloc = make()
    with pytest.raises(error, match="full_to_swa_index_mapping"):
        pool.register_mapping(mapping)
    assert pool.full_to_swa_index_mapping is alloc.full_to_swa_index_mapping


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"size_swa": 0}, ValueError, "size_swa"),
        ({"size_swa": 7}, ValueError, "size"),  # not a page multiple
        ({"swa_attention_layer_ids": [1, 3]}, ValueError, "disjoint"),
        ({"swa_attention_layer_ids": []}, ValueError, "swa_attention_layer_ids"),
        ({"full_attention_layer_ids": [0, 0]}, ValueError, "full_attention_layer_ids"),
        ({"full_attention_layer_ids": ["0"]}, TypeError, "full_attention_layer_ids"),
        ({"token_to_kv_pool_class": dict}, TypeError, "full_kv_pool_class"),
        ({"swa_kv_pool_class": MHATokenToKVPool, "head_dim": 0}, ValueError, "head_dim"),
        ({"start_layer": 2}, ValueError, "start_layer"),
        (
            {"swa_kv_pool_kwargs": {"page_size": 4, "head_num": 2, "head_dim": 4, "device": "cpu"}},
            ValueError,
            "page_size",
        ),
    ],
)
def test_constructor_misuse(kwargs: dict[str, object], error: type, name: str) -> None:
    args: dict[str, object] = {
        "size": SIZE, "size_swa": SIZE_SWA, "page_size": PAGE, "dtype": torch.float16,
        "head_num": HEADS, "head_dim": DIM, "swa_attention_layer_ids": SWA_IDS,
        "full_attention_layer_ids": FULL_IDS, "device": "cpu",
    }  # fmt: skip
    with pytest.raises(error, match=name):
        SWAKVPool(**(args | kwargs))  # type: ignore[arg-type]
