"""Build the device KV pool a model's attention expects, and a cache-free reference run."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hicache.model.batch import ForwardBatch
from hicache.model.config import ModelConfig
from hicache.model.shard import TPShard
from hicache.model.transformer import TinyTransformer
from hicache.pools import (
    MHATokenToKVPool,
    MLATokenToKVPool,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)


def make_kv_pool(
    cfg: ModelConfig,
    size: int,
    page_size: int,
    device: torch.device | str,
    shard: TPShard | None = None,
) -> MHATokenToKVPool | MLATokenToKVPool:
    """A device pool of ``size`` usable slots shaped for ``cfg``'s attention (MHA or MLA), as
    ``shard`` (default: one rank) holds it: MHA its block of the KV heads, MLA the latent."""
    if cfg.attention == "mla":
        return MLATokenToKVPool(
            size,
            page_size,
            cfg.dtype,
            cfg.kv_lora_rank,
            cfg.qk_rope_head_dim,
            cfg.num_layers,
            device,
        )
    heads = (shard or TPShard()).kv_heads(cfg)
    return MHATokenToKVPool(size, page_size, cfg.dtype, heads, cfg.head_dim, cfg.num_layers, device)


def reference_logits(model: TinyTransformer, token_ids: Sequence[int]) -> torch.Tensor:
    """Next-token logits at every position of ``token_ids`` from one prefill in a fresh pool.

    No prefix cache is involved: this is the from-scratch answer a cached run must reproduce.

    Returns
    -------
    ``[len(token_ids), vocab]`` fp32 on the model device; row ``i`` predicts token ``i + 1``.
    """
    n = len(token_ids)
    pool = make_kv_pool(model.cfg, n, 1, model.device, model.shard)
    allocator = TokenToKVPoolAllocator(n, 1, model.device, kvcache=pool)
    req_pool = ReqToTokenPool(1, n, model.device)
    slots = allocator.alloc(n)
    assert slots is not None
    req_pool.write((0, slice(0, n)), slots.to(torch.int32))
    table = req_pool.req_to_token
    batch = ForwardBatch.build(table, [0], [0], [list(token_ids)], slots, model.device)
    logits: torch.Tensor = model(batch, pool, all_logits=True)
    return logits
