"""NSATokenToKVPool: the indexer's FP8 keys and fp32 scales in SGLang's page layout, checked
byte by byte against a reference that computes each byte's offset on its own; misuse."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import MLATokenToKVPool, MLATokenToKVPoolHost, NSATokenToKVPool
from tests.pools.helpers import DEVICES, POISON, fill_random, poison
from tests.pools.nsa_helpers import (
    HEAD,
    PAGE,
    ROW,
    FakeCounter,
    index_inputs,
    nsa_pool,
    reference_read,
    reference_write,
)


@pytest.mark.parametrize("device", DEVICES)
def test_buffers_and_state_infos(device: str) -> None:
    pool = nsa_pool(device, layers=3)
    assert isinstance(pool, MLATokenToKVPool) and pool.kind == "NSA"
    assert pool.kv_buffer[0].shape == (192, 1, 24)  # the MLA latent as before
    bufs = pool.index_k_with_scale_buffer
    assert len(bufs) == 3 and pool.index_num_pages == 3
    for buf in bufs:
        assert buf.shape == (3, ROW) and buf.dtype == torch.uint8 and buf.device.type == device
    ptrs, lens, items = pool.get_state_buf_infos()
    assert ptrs == [b.data_ptr() for b in bufs]
    assert lens == [3 * ROW] * 3 and items == [ROW] * 3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale_shape", ["flat", "column"])
def test_set_writes_sglang_layout_byte_exact(device: str, scale_shape: str) -> None:
    pool = nsa_pool(device)
    for buf in pool.index_k_with_scale_buffer:
        poison(buf)
    loc_list = [64, 127, 130, 65, 191, 100]  # pages 1 and 2, both ends of a page
    loc = torch.tensor(loc_list, device=device)
    keys, scales = index_inputs(len(loc_list), device)
    given = scales[:, None] if scale_shape == "column" else scales
    pool.set_index_k_scale_buffer(1, loc, keys, given)
    expected = reference_write(
        torch.full((3, ROW), POISON, dtype=torch.uint8), loc_list, keys, scales
    )
    assert torch.equal(pool.index_k_with_scale_buffer[1].cpu(), expected)
    assert (pool.index_k_with_scale_buffer[0] == POISON).all()  # the other layer untouched


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seq_len", [0, 1, 64, 100, 128])
def test_continuous_getters_match_reference(device: str, seq_len: int) -> None:
    pool = nsa_pool(device, size=192)
    fill_random(pool.index_k_with_scale_buffer, seed=seq_len)
    pages = [3, 1, 2]  # more pages than the sequence needs; the extra one is never read
    page_indices = torch.tensor(pages, dtype=torch.int32, device=device)
    want_k, want_s = reference_read(pool.index_k_with_scale_buffer[0], seq_len, pages)
    got_k = pool.get_index_k_continuous(0, seq_len, page_indices)
    got_s = pool.get_index_k_scale_continuous(0, seq_len, page_indices)
    fused_k, fused_s = pool.get_index_k_scale_buffer(0, seq_len, page_indices)
    for got, want in ((got_k, want_k), (fused_k, want_k), (got_s, want_s), (fused_s, want_s)):
        assert got.dtype == torch.uint8 and got.device.type == device
        assert torch.equal(got.cpu(), want)  # shape too


@pytest.mark.parametrize("device", DEVICES)
def test_set_then_get_round_trip(device: str) -> None:
    pool = nsa_pool(device)
    for buf in pool.index_k_with_scale_buffer:
        poison(buf)
    loc = torch.arange(128, 192, device=device)  # a whole sequence in page 2 ...
    keys, scales = index_inputs(64, device, seed=3)
    pool.set_index_k_scale_buffer(0, loc[:40], keys[:40], scales[:40])
    page_indices = torch.tensor([2], device=device)
    got_k, got_s = pool.get_index_k_scale_buffer(0, 40, page_indices)
    assert torch.equal(got_k, keys[:40].view(torch.uint8))
    assert torch.equal(got_s.view(torch.float32).flatten(), scales[:40])
    tail = pool.get_index_k_continuous(0, 64, page_indices)[40:]  # ... of which 40 written
    assert (tail == POISON).all()


def test_getters_wait_on_the_counter() -> None:
    pool = nsa_pool()
    counter = FakeCounter()
    pool.register_layer_transfer_counter(counter)
    pages = torch.tensor([1])
    pool.get_index_k_with_scale_buffer(1)
    pool.get_index_k_continuous(0, 3, pages)
    pool.get_index_k_scale_continuous(1, 3, pages)
    pool.get_index_k_scale_buffer(0, 3, pages)
    assert counter.waits == [1, 0, 1, 0]


def snapshot(pool: NSATokenToKVPool) -> list[torch.Tensor]:
    return [b.clone() for b in pool.index_k_with_scale_buffer]


SET_MISUSE = [
    ({"layer_id": 2}, ValueError, "layer_id"),
    ({"loc": torch.tensor([64.0, 65.0])}, TypeError, "loc"),
    ({"loc": torch.tensor([64, 192])}, ValueError, "loc"),
    ({"index_k": torch.zeros(2, HEAD, dtype=torch.bfloat16)}, TypeError, "index_k must have"),
    ({"index_k": torch.zeros(2, 64, dtype=torch.float8_e4m3fn)}, ValueError, "index_k must"),
    ({"index_k": torch.zeros(3, HEAD, dtype=torch.float8_e4m3fn)}, ValueError, "index_k must"),
    ({"index_k_scale": torch.ones(2, dtype=torch.float16)}, TypeError, "index_k_scale"),
    ({"index_k_scale": torch.ones(2, 2)}, ValueError, "index_k_scale"),
    ({"index_k_scale": [1.0, 1.0]}, TypeError, "index_k_scale"),
]


@pytest.mark.parametrize(
    "bad, exc, name", SET_MISUSE, ids=[m[2] + str(i) for i, m in enumerate(SET_MISUSE)]
)
def test_set_misuse_writes_nothing(bad: dict, exc: type, name: str) -> None:
    pool = nsa_pool()
    fill_random(pool.index_k_with_scale_buffer)
    before = snapshot(pool)
    keys, scales = index_inputs(2, "cpu")
    args = {"layer_id": 0, "loc": torch.tensor([64, 65]), "index_k": keys, "index_k_scale": scales}
    with pytest.raises(exc, match=name):
        pool.set_index_k_scale_buffer(**{**args, **bad})
    assert all(
        torch.equal(a, b) for a, b in zip(before, pool.index_k_with_scale_buffer, strict=True)
    )
    pool.set_index_k_scale_buffer(**args)  # a correct call works afterwards
    assert torch.equal(pool.get_index_k_continuous(0, 2, torch.tensor([1])), keys.view(torch.uint8))


GET_MISUSE = [
    ({"layer_id": -1}, ValueError, "layer_id"),
    ({"seq_len": -1}, ValueError, "seq_len"),
    ({"seq_len": True}, TypeError, "seq_len"),
    ({"seq_len": 129}, ValueError, "page_indices must hold at least 3"),
    ({"page_indices": [1]}, TypeError, "page_indices"),
    ({"page_indices": torch.tensor([1.0])}, TypeError, "page_indices"),
    ({"page_indices": torch.tensor([[1]])}, TypeError, "page_indices"),
    ({"page_indices": torch.tensor([3])}, IndexError, "page_indices"),
    ({"page_indices": torch.tensor([-1])}, IndexError, "page_indices"),
]


@pytest.mark.parametrize(
    "bad, exc, name", GET_MISUSE, ids=[m[2] + str(i) for i, m in enumerate(GET_MISUSE)]
)
@pytest.mark.parametrize(
    "getter", ["get_index_k_continuous", "get_index_k_scale_continuous", "get_index_k_scale_buffer"]
)
def test_get_misuse(getter: str, bad: dict, exc: type, name: str) -> None:
    pool = nsa_pool()
    args = {"layer_id": 0, "seq_len": 5, "page_indices": torch.tensor([1, 0])}
    with pytest.raises(exc, match=name):
        getattr(pool, getter)(**{**args, **bad})


def test_unused_pages_are_not_checked() -> None:
    pool = nsa_pool()  # pages past ceil(seq_len / 64) are never read, as in SGLang
    assert pool.get_index_k_continuous(0, 64, torch.tensor([1, 99])).shape == (64, HEAD)


CTOR_MISUSE = [
    ({"page_size": 32}, ValueError, "page_size must be 64"),
    ({"index_head_dim": 64}, ValueError, "index_head_dim must be 128"),
    ({"index_head_dim": 128.0}, TypeError, "index_head_dim"),
    ({"kv_cache_dim": 656}, ValueError, "kv_cache_dim must be"),
    ({"kv_cache_dim": "24"}, TypeError, "kv_cache_dim"),
]


@pytest.mark.parametrize("bad, exc, match", CTOR_MISUSE)
def test_constructor_misuse(bad: dict, exc: type, match: str) -> None:
    args = {
        "size": 128,
        "page_size": 64,
        "kv_lora_rank": 16,
        "dtype": torch.bfloat16,
        "qk_rope_head_dim": 8,
        "layer_num": 1,
        "device": "cpu",
        "index_head_dim": 128,
    }
    with pytest.raises(exc, match=match):
        NSATokenToKVPool(**{**args, **bad})
    assert NSATokenToKVPool(**args, kv_cache_dim=24).kv_cache_dim == 24


def test_host_pool_refuses_nsa() -> None:
    with pytest.raises(TypeError, match="device_pool must be a MLATokenToKVPool.*kind 'NSA'"):
        MLATokenToKVPoolHost(nsa_pool(), 2.0, 0, PAGE, "layer_first")
    mla = MLATokenToKVPool(128, PAGE, torch.bfloat16, 16, 8, 2, "cpu")
    host = MLATokenToKVPoolHost(mla, 2.0, 0, PAGE, "layer_first")
    assert host.mismatch(nsa_pool()) == ["kind: host pool MLA, device pool NSA"]
