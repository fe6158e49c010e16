"""Attention layers that keep their KV only in a token pool.

A layer is full attention or, where ``cfg.layer_kinds`` says ``S``, sliding-window attention:
it then writes through the ``ForwardContext`` (an ``SWAKVPool``'s SWA slots) and reads only
the keys in each query's window (``hicache.model.window``).

Both layers write the new tokens' KV with ``pool.set_kv_buffer`` and read the context back only
through ``pool.get_key_buffer`` / ``pool.get_value_buffer``; those calls wait on the pool's
registered layer-transfer counter, so attention for layer ``l`` starts once layer ``l`` of any
host-to-device load has landed.

Under tensor parallelism (``TPShard``) a layer holds its rank's block of the heads and returns
the output projection summed over the ranks.
"""

from __future__ import annotations

import torch
from torch import nn

from hicache.model.config import ModelConfig
from hicache.model.context import ForwardContext
from hicache.model.layers import RMSNorm, apply_rope, seeded_linear
from hicache.model.shard import TPShard


class MHAAttention(nn.Module):
    """Grouped-query attention with RoPE; the pool holds K and V per KV head.

    The context's pool is an ``MHATokenToKVPool`` (or a composite of them) with ``head_num``
    the shard's KV heads (``num_kv_heads // shard.size``) and ``head_dim == head_dim``.
    """

    def __init__(
        self, cfg: ModelConfig, layer_id: int, gen: torch.Generator, shard: TPShard
    ) -> None:
        super().__init__()
        self.cfg, self.layer_id, self.shard = cfg, layer_id, shard
        self.window = cfg.layer_kinds[layer_id] == "S"
        self.heads, self.kv_heads = cfg.num_heads // shard.size, shard.kv_heads(cfg)
        hidden, q_dim = cfg.hidden_size, cfg.num_heads * cfg.head_dim
        kv_dim = cfg.num_kv_heads * cfg.head_dim
        q_rows, kv_rows = shard.part(q_dim), shard.part(kv_dim)
        self.q_proj = seeded_linear(hidden, q_dim, gen, cfg.dtype, rows=q_rows)
        self.k_proj = seeded_linear(hidden, kv_dim, gen, cfg.dtype, rows=kv_rows)
        self.v_proj = seeded_linear(hidden, kv_dim, gen, cfg.dtype, rows=kv_rows)
        self.o_proj = seeded_linear(q_dim, hidden, gen, cfg.dtype, cols=q_rows)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``x``: ``[T, hidden]`` -> ``[T, hidden]``; stores the new K/V at ``out_cache_loc``."""
        cfg, n, pos = self.cfg, x.shape[0], ctx.batch.positions
        q = apply_rope(self.q_proj(x).view(n, self.heads, -1), pos, cfg.rope_theta)
        k = apply_rope(self.k_proj(x).view(n, self.kv_heads, -1), pos, cfg.rope_theta)
        v = self.v_proj(x).view(n, self.kv_heads, -1)
        pool = ctx.kv_pool()
        k_buf = pool.get_key_buffer(self.layer_id)
        v_buf = pool.get_value_buffer(self.layer_id)
        ctx.write_kv(self.layer_id, self.window, k, v)
        out = ctx.attend(self.window, q, lambda s: (k_buf[s], v_buf[s]), cfg.head_dim**-0.5)
        return self.shard.all_reduce(self.o_proj(out.reshape(n, -1)))


class MLAAttention(nn.Module):
    """Multi-head latent attention (un-absorbed): the pool holds one latent per token.

    The latent is ``[c, k_rope]``: ``c`` (``kv_lora_rank`` channels, RMS-normed) is up-projected
    to each head's no-rope key and its value; ``k_rope`` (``qk_rope_head_dim`` channels, rotated)
    is shared by all heads. The context's pool is an ``MLATokenToKVPool`` (or a composite of
    them) with the same two dims; every shard holds the whole latent and its block of the heads.
    """

    def __init__(
        self, cfg: ModelConfig, layer_id: int, gen: torch.Generator, shard: TPShard
    ) -> None:
        super().__init__()
        self.cfg, self.layer_id, self.shard = cfg, layer_id, shard
        self.window = cfg.layer_kinds[layer_id] == "S"
        self.heads = cfg.num_heads // shard.size
        hidden, h, r = cfg.hidden_size, cfg.num_heads, cfg.kv_lora_rank
        q_dim, head_rows = h * (cfg.head_dim + cfg.qk_rope_head_dim), shard.part(h * cfg.head_dim)
        self.q_proj = seeded_linear(hidden, q_dim, gen, cfg.dtype, rows=shard.part(q_dim))
        self.kv_a = seeded_linear(hidden, r + cfg.qk_rope_head_dim, gen, cfg.dtype)
        self.kv_norm = RMSNorm(r, cfg.dtype)
        self.k_up = seeded_linear(r, h * cfg.head_dim, gen, cfg.dtype, rows=head_rows)
        self.v_up = seeded_linear(r, h * cfg.head_dim, gen, cfg.dtype, rows=head_rows)
        self.o_proj = seeded_linear(h * cfg.head_dim, hidden, gen, cfg.dtype, cols=head_rows)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``x``: ``[T, hidden]`` -> ``[T, hidden]``; stores new latents at ``out_cache_loc``."""
        cfg, n, r, batch = self.cfg, x.shape[0], self.cfg.kv_lora_rank, ctx.batch
        q = self.q_proj(x).view(n, self.heads, -1)
        q_rope = apply_rope(q[..., cfg.head_dim :], batch.positions, cfg.rope_theta)
        q = torch.cat([q[..., : cfg.head_dim], q_rope], dim=-1)
        latent = self.kv_a(x)
        k_rope = apply_rope(latent[:, None, r:], batch.positions, cfg.rope_theta)
        cache_kv = torch.cat([self.kv_norm(latent[:, None, :r]), k_rope], dim=-1)
        pool = ctx.kv_pool()
        kv_buf = pool.get_key_buffer(self.layer_id)
        c_buf = pool.get_value_buffer(self.layer_id)
        ctx.write_kv(self.layer_id, self.window, cache_kv)
        scale = (cfg.head_dim + cfg.qk_rope_head_dim) ** -0.5
        out = ctx.attend(
            self.window, q, lambda s: self._expand(kv_buf[s][:, 0], c_buf[s][:, 0]), scale
        )
        return self.shard.all_reduce(self.o_proj(out.reshape(n, -1)))

    def _expand(self, latent: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[S, r + dr]`` latents and ``[S, r]`` c -> per-head ``[S, H, D + dr]`` keys and
        ``[S, H, D]`` values."""
        cfg, s, h = self.cfg, c.shape[0], self.heads
        k_nope = self.k_up(c).view(s, h, cfg.head_dim)
        k_rope = latent[:, None, cfg.kv_lora_rank :].expand(s, h, -1)
        v = self.v_up(c).view(s, h, cfg.head_dim)
        return torch.cat([k_nope, k_rope], dim=-1), v
