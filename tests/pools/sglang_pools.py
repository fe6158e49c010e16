"""Every device KV pool, built as SGLang's model runner builds it (keywords), plus what the
conformance tests read of each: its layer ids, slots to use, and its state gathered at slots."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hicache.pools import (
    DoubleSparseTokenToKVPool,
    HybridLinearKVPool,
    MambaPool,
    MambaStateParams,
    MHATokenToKVPool,
    MHATokenToKVPoolFP4,
    MLATokenToKVPool,
    MLATokenToKVPoolFP4,
    NSATokenToKVPool,
    SWAKVPool,
    SWATokenToKVPoolAllocator,
)

DT = torch.bfloat16


def cache_params() -> MambaStateParams:
    """Two Mamba layers (model ids 0 and 2), one conv tensor, a small SSM state."""
    return MambaStateParams(
        layers=[0, 2], conv=[(6, 3)], temporal=(2, 4, 5), conv_dtype=torch.bfloat16
    )


def mamba_pool(device: str = "cpu", draft: int | None = None) -> MambaPool:
    """Four state slots of :func:`cache_params`; speculative buffers for ``draft`` tokens."""
    return MambaPool(
        size=4,
        spec_state_size=4,
        cache_params=cache_params(),
        device=device,
        enable_memory_saver=False,
        speculative_num_draft_tokens=draft,
    )


def mha(device: str) -> MHATokenToKVPool:
    return MHATokenToKVPool(
        size=32, page_size=16, dtype=DT, head_num=2, head_dim=8, layer_num=2, device=device,
        enable_memory_saver=False, start_layer=2, end_layer=3,
    )  # fmt: skip


def mla(device: str) -> MLATokenToKVPool:
    return MLATokenToKVPool(
        size=32, page_size=16, dtype=DT, kv_lora_rank=16, qk_rope_head_dim=8, layer_num=2,
        device=device, enable_memory_saver=False,
    )  # fmt: skip


def mha_fp4(device: str) -> MHATokenToKVPoolFP4:
    return MHATokenToKVPoolFP4(
        size=32, page_size=16, dtype=DT, head_num=2, head_dim=16, layer_num=2, device=device,
        enable_memory_saver=False,
    )  # fmt: skip


def mla_fp4(device: str) -> MLATokenToKVPoolFP4:
    return MLATokenToKVPoolFP4(
        size=32, page_size=16, dtype=DT, kv_lora_rank=16, qk_rope_head_dim=16, layer_num=2,
        device=device, enable_memory_saver=False,
    )  # fmt: skip


def nsa(device: str) -> NSATokenToKVPool:
    return NSATokenToKVPool(
        size=64, page_size=64, kv_lora_rank=16, dtype=DT, qk_rope_head_dim=8, layer_num=2,
        device=device, index_head_dim=128, enable_memory_saver=False, kv_cache_dim=24,
    )  # fmt: skip


def double_sparse(device: str) -> DoubleSparseTokenToKVPool:
    return DoubleSparseTokenToKVPool(
        size=32, page_size=16, dtype=DT, head_num=2, head_dim=8, layer_num=2, device=device,
        heavy_channel_num=4, enable_memory_saver=False,
    )  # fmt: skip


def swa_pool_and_allocator(device: str) -> tuple[SWAKVPool, SWATokenToKVPoolAllocator]:
    pool = SWAKVPool(
        size=64, size_swa=32, page_size=16, dtype=DT, head_num=2, head_dim=8,
        swa_attention_layer_ids=[1, 3], full_attention_layer_ids=[0, 2],
        enable_kvcache_transpose=False, device=device, enable_memory_saver=False,
    )  # fmt: skip
    alloc = SWATokenToKVPoolAllocator(
        64, 32, page_size=16, dtype=DT, device=device, kvcache=pool, need_sort=False
    )
    return pool, alloc


def swa(device: str) -> SWAKVPool:
    return swa_pool_and_allocator(device)[0]


def hybrid_linear(device: str) -> HybridLinearKVPool:
    params = MambaStateParams(layers=[0, 2], conv=[(4, 3)], temporal=(2, 2, 4))
    mamba = MambaPool(size=2, cache_params=params, device=device, spec_state_size=2)
    return HybridLinearKVPool(
        size=32, dtype=DT, page_size=16, head_num=2, head_dim=8,
        full_attention_layer_ids=[1, 3], enable_kvcache_transpose=False, device=device,
        mamba_pool=mamba,
    )  # fmt: skip


FACTORIES: dict[str, Callable[[str], Any]] = {
    "MHATokenToKVPool": mha,
    "MLATokenToKVPool": mla,
    "MHATokenToKVPoolFP4": mha_fp4,
    "MLATokenToKVPoolFP4": mla_fp4,
    "NSATokenToKVPool": nsa,
    "DoubleSparseTokenToKVPool": double_sparse,
    "SWAKVPool": swa,
    "HybridLinearKVPool": hybrid_linear,
}


def kv_layers(pool: Any) -> list[int]:
    """The global layer ids that have KV in ``pool``."""
    if hasattr(pool, "layers_mapping"):
        return sorted(pool.layers_mapping)
    return list(range(pool.start_layer, pool.start_layer + pool.layer_num))


def inner(pool: Any) -> list[Any]:
    """The plain pools holding ``pool``'s KV (itself when it is one)."""
    return pool.inner_pools if hasattr(pool, "inner_pools") else [pool]


def all_buffers(pool: Any) -> list[torch.Tensor]:
    """Every tensor of ``pool``'s state (for byte-identity checks)."""
    out = [b for p in inner(pool) for kind in p.row_buffers for b in kind]
    out += [b for p in inner(pool) for b in getattr(p, "index_k_with_scale_buffer", [])]
    mamba = getattr(pool, "mamba_pool", None)
    return out + ([] if mamba is None else mamba.mamba_cache.tensors())


def randomize(pool: Any, seed: int) -> None:
    """Random bytes in every buffer (never zeros)."""
    gen = torch.Generator().manual_seed(seed)
    for b in all_buffers(pool):
        raw = torch.randint(1, 256, (b.nbytes,), dtype=torch.uint8, generator=gen)
        b.view(torch.uint8).view(-1).copy_(raw.to(b.device))


def slots(pool: Any, n: int) -> torch.Tensor:
    """``n`` distinct usable full-pool slots (allocated, with SWA slots, for an SWA pool)."""
    if isinstance(pool, SWAKVPool):
        alloc = SWATokenToKVPoolAllocator(
            pool.size, pool.size_swa, pool.page_size, pool.device, pool
        )
        got = alloc.alloc(pool.page_size * 2)
        assert got is not None
        return got[:n]
    return torch.arange(pool.page_size, pool.page_size + n, device=pool.device)


def gather(pool: Any, loc: torch.Tensor) -> list[torch.Tensor]:
    """``pool``'s state of full-pool slots ``loc``: every row buffer's rows (SWA ones through
    the mapping) and NSA index keys and scales, as new tensors."""
    if isinstance(pool, SWAKVPool):
        swa_loc = pool.translate_loc_from_full_to_swa(loc)
        return gather(pool.full_kv_pool, loc) + gather(pool.swa_kv_pool, swa_loc)
    if isinstance(pool, HybridLinearKVPool):
        return gather(pool.full_kv_pool, loc)
    out = [b[loc].clone() for kind in pool.row_buffers for b in kind]
    if isinstance(pool, NSATokenToKVPool):
        pages = torch.arange(pool.index_num_pages, device=pool.device)
        n = pool.index_num_pages * pool.page_size
        for layer in kv_layers(pool):
            keys, scales = pool.get_index_k_scale_buffer(layer, n, pages)
            out += [keys[loc], scales[loc]]
    return out
