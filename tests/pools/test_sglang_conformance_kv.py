"""Conformance of the KV pools to SGLang's memory_pool.py / swa_memory_pool.py: each class
built with SGLang's keywords, checked for the shapes, dtypes and routing its callers rely on."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import (
    DoubleSparseTokenToKVPool,
    HybridLinearKVPool,
    MHATokenToKVPool,
    MHATokenToKVPoolFP4,
    MLATokenToKVPoolFP4,
    NSATokenToKVPool,
)
from tests.pools.sglang_pools import mamba_pool, swa_pool_and_allocator


def test_mha_pool_takes_sglang_keywords() -> None:
    pool = MHATokenToKVPool(
        size=32,
        page_size=16,
        dtype=torch.bfloat16,
        head_num=4,
        head_dim=16,
        layer_num=2,
        device="cpu",
        enable_memory_saver=False,
        v_head_dim=8,
        swa_head_num=2,
        swa_head_dim=8,
        swa_v_head_dim=4,
        start_layer=3,
        end_layer=4,
        enable_kv_cache_copy=False,
    )
    assert (pool.head_num, pool.head_dim, pool.v_head_dim) == (2, 8, 4)  # swa_* win
    assert pool.get_key_buffer(3).shape == (48, 2, 8)
    assert pool.get_value_buffer(4).shape == (48, 2, 4)
    k, v = pool.get_kv_size_bytes()
    assert (k, v) == (2 * 48 * 2 * 8 * 2, 2 * 48 * 2 * 4 * 2)
    with pytest.raises(ValueError, match="layer_id"):
        pool.get_key_buffer(2)


def test_fp4_buffers_have_sglang_shapes() -> None:
    mha = MHATokenToKVPoolFP4(
        size=16, page_size=16, dtype=torch.bfloat16, head_num=2, head_dim=32, layer_num=1,
        device="cpu", enable_memory_saver=False,
    )  # fmt: skip
    assert mha.k_buffer[0].shape == (32, 2, 16) and mha.k_buffer[0].dtype == torch.uint8
    assert mha.k_scale_buffer[0].shape == (32, 2 * 32 // 16)
    assert mha.v_scale_buffer[0].dtype == torch.uint8 and mha.store_dtype == torch.uint8
    mla = MLATokenToKVPoolFP4(
        size=16, page_size=16, dtype=torch.bfloat16, kv_lora_rank=32, qk_rope_head_dim=16,
        layer_num=1, device="cpu", enable_memory_saver=False,
    )  # fmt: skip
    assert mla.kv_buffer[0].shape == (32, 1, 24) and mla.kv_scale_buffer[0].shape == (32, 3)
    assert mla.get_key_buffer(0).dtype == torch.bfloat16
    assert mla.get_value_buffer(0).shape == (32, 1, 32)


def test_nsa_index_buffer_has_sglang_layout() -> None:
    pool = NSATokenToKVPool(
        size=128, page_size=64, kv_lora_rank=16, dtype=torch.bfloat16, qk_rope_head_dim=8,
        layer_num=2, device="cpu", index_head_dim=128, enable_memory_saver=False, kv_cache_dim=24,
    )  # fmt: skip
    buf = pool.get_index_k_with_scale_buffer(1)
    assert buf.shape == ((128 + 64 + 1) // 64, 64 * (128 + 128 // 128 * 4))
    assert (
        buf.dtype == torch.uint8 and buf.data_ptr() == pool.index_k_with_scale_buffer[1].data_ptr()
    )
    ptrs, lens, items = pool.get_state_buf_infos()
    assert ptrs == [b.data_ptr() for b in pool.index_k_with_scale_buffer]
    assert lens == [b.nbytes for b in pool.index_k_with_scale_buffer]
    assert items == [b[0].nbytes for b in pool.index_k_with_scale_buffer]
    latent = sum(b.nbytes for b in pool.kv_buffer)
    assert pool.get_kv_size_bytes() == latent + sum(lens)
    with pytest.raises(ValueError, match="page_size"):
        NSATokenToKVPool(128, 16, 16, torch.bfloat16, 8, 2, "cpu", 128)


def test_double_sparse_set_kv_buffer_writes_labels() -> None:
    pool = DoubleSparseTokenToKVPool(
        size=16, page_size=1, dtype=torch.float16, head_num=2, head_dim=8, layer_num=2,
        device="cpu", heavy_channel_num=3, enable_memory_saver=False,
    )  # fmt: skip
    assert pool.get_label_buffer(1).shape == (17, 2, 3)  # SGLang: size + 1 rows
    loc = torch.tensor([3, 5])
    k, v, label = (torch.rand(2, 2, d, dtype=torch.float16) + 1 for d in (8, 8, 3))
    pool.set_kv_buffer(1, loc, k, v, label)
    assert torch.equal(pool.get_label_buffer(1)[loc], label)
    assert torch.equal(pool.get_key_buffer(1)[loc], k)
    assert not pool.get_label_buffer(0).any()


def test_swa_pool_translation_and_layers() -> None:
    pool, alloc = swa_pool_and_allocator("cpu")
    assert pool.layers_mapping == {0: (0, False), 2: (1, False), 1: (0, True), 3: (1, True)}
    mapping = pool.full_to_swa_index_mapping
    assert mapping is not None and mapping.dtype == torch.int64
    assert mapping.shape == (pool.size + pool.page_size + 1,)
    full = alloc.alloc(16)
    assert full is not None and full.dtype == torch.int64
    swa = pool.translate_loc_from_full_to_swa(full)
    assert swa.dtype == torch.int32 and swa.shape == full.shape  # SGLang: .to(torch.int32)
    assert torch.equal(swa.long(), mapping[full]) and bool((swa > 0).all())
    assert pool.translate_loc_from_full_to_swa(torch.tensor([-1])).tolist() == [-1]
    assert pool.get_key_buffer(3).shape[0] == pool.size_swa + pool.page_size
    assert pool.get_key_buffer(2).shape[0] == pool.size + pool.page_size


def test_hybrid_linear_pool_routes_full_layers_only() -> None:
    m = mamba_pool()
    pool = HybridLinearKVPool(
        size=32, dtype=torch.bfloat16, page_size=16, head_num=2, head_dim=8,
        full_attention_layer_ids=[1, 3], enable_kvcache_transpose=False, device="cpu",
        mamba_pool=m, enable_memory_saver=False,
    )  # fmt: skip
    assert pool.full_attention_layer_id_mapping == {1: 0, 3: 1}
    assert pool.get_key_buffer(3).data_ptr() == pool.full_kv_pool.k_buffer[1].data_ptr()
    for bad in (0, 2):  # linear layers: no KV
        with pytest.raises(ValueError, match="layer_id"):
            pool.get_value_buffer(bad)
    assert pool.get_state_buf_infos() == m.get_contiguous_buf_infos()
    assert pool.get_state_dim_per_tensor() == m.get_state_dim_per_tensor()
    assert pool.get_kv_size_bytes() == pool.full_kv_pool.get_kv_size_bytes()
    mla = HybridLinearKVPool(
        size=32, dtype=torch.bfloat16, page_size=16, head_num=1, head_dim=24,
        full_attention_layer_ids=[1], enable_kvcache_transpose=False, device="cpu",
        mamba_pool=m, use_mla=True, kv_lora_rank=16, qk_rope_head_dim=8,
    )  # fmt: skip
    assert isinstance(mla.get_kv_size_bytes(), int)
    assert mla.get_key_buffer(1).shape == (48, 1, 24)
    with pytest.raises(ValueError, match="enable_kvcache_transpose"):
        HybridLinearKVPool(
            32, torch.bfloat16, 16, 2, 8, [1], "cpu", m, enable_kvcache_transpose=True
        )
