"""A tiny decoder-only transformer whose KV cache lives in a hicache token pool."""

from __future__ import annotations

import torch
from torch import nn

from hicache.model.attention import MHAAttention, MLAAttention
from hicache.model.batch import ForwardBatch
from hicache.model.config import ModelConfig
from hicache.model.layers import RMSNorm, SwiGLU, seeded_linear
from hicache.pools import KVPool


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, gen: torch.Generator) -> None:
        super().__init__()
        attn_cls = MLAAttention if cfg.attention == "mla" else MHAAttention
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.dtype)
        self.attn = attn_cls(cfg, layer_id, gen)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.dtype)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, gen, cfg.dtype)

    def forward(self, h: torch.Tensor, batch: ForwardBatch, pool: KVPool) -> torch.Tensor:
        """``pool``: the MHA or MLA token pool matching ``cfg.attention``."""
        h = h + self.attn(self.attn_norm(h), batch, pool)
        out: torch.Tensor = h + self.mlp(self.mlp_norm(h))
        return out


class TinyTransformer(nn.Module):
    """Pre-norm decoder with seeded random weights (a pure function of ``cfg`` and the device).

    Weights are drawn on ``device`` from a generator seeded with ``cfg.seed``. The LM head runs
    in fp32, so logits are not rounded to ``cfg.dtype`` (a bf16 logit near 4 would be a multiple
    of 1/32): comparing two runs' logits then measures only what differs upstream.
    """

    def __init__(self, cfg: ModelConfig, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.cfg, self.device = cfg, torch.device(device)
        gen = torch.Generator(device=self.device).manual_seed(cfg.seed)
        with torch.device(self.device):
            embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
            self.embed = nn.Parameter(embed.to(cfg.dtype), requires_grad=False)
            self.layers = nn.ModuleList(DecoderLayer(cfg, i, gen) for i in range(cfg.num_layers))
            self.norm = RMSNorm(cfg.hidden_size, cfg.dtype)
            self.lm_head = seeded_linear(cfg.hidden_size, cfg.vocab_size, gen, torch.float32)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, pool: KVPool, all_logits: bool = False) -> torch.Tensor:
        """Run one extend/decode pass, writing every new token's KV into ``pool``.

        Returns
        -------
        ``[B, vocab]`` fp32 logits of each request's last new token, or with ``all_logits``
        ``[T, vocab]`` for every packed new token. On the model device.
        """
        h = self.embed[batch.input_ids]
        for layer in self.layers:
            h = layer(h, batch, pool)
        if not all_logits:
            h = h[batch.last_index]
        logits: torch.Tensor = self.lm_head(self.norm(h).float())
        return logits
