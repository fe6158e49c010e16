"""Build the device KV pool a full-attention model's attention expects."""

from __future__ import annotations

import torch

from hicache.model.config import ModelConfig
from hicache.model.shard import TPShard
from hicache.pools import (
    MHATokenToKVPool,
    MLATokenToKVPool,
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
