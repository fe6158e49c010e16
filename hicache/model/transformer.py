"""A tiny decoder-only transformer whose KV cache (and recurrent state) lives in hicache pools."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hicache.model.attention import MHAAttention, MLAAttention
from hicache.model.batch import ForwardBatch
from hicache.model.config import ModelConfig
from hicache.model.context import ForwardContext
from hicache.model.layers import RMSNorm, SwiGLU, seeded_linear
from hicache.model.linear import LinearRecurrence
from hicache.model.shard import TPShard
from hicache.pools import HybridReqToTokenPool


def _mixer_class(cfg: ModelConfig, layer_id: int) -> type[nn.Module]:
    if cfg.layer_kinds[layer_id] == "L":
        return LinearRecurrence
    return MLAAttention if cfg.attention == "mla" else MHAAttention


class DecoderLayer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, layer_id: int, gen: torch.Generator, shard: TPShard
    ) -> None:
        super().__init__()
        self.shard = shard
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.dtype)
        self.attn = _mixer_class(cfg, layer_id)(cfg, layer_id, gen, shard)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.dtype)
        inter = cfg.intermediate_size
        self.mlp = SwiGLU(cfg.hidden_size, inter, gen, cfg.dtype, cols=shard.part(inter))

    def forward(self, h: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``h``: ``[T, hidden]``; the token mixer (attention or linear) reads ``ctx``."""
        h = h + self.attn(self.attn_norm(h), ctx)
        out: torch.Tensor = h + self.shard.all_reduce(self.mlp(self.mlp_norm(h)))
        return out


class TinyTransformer(nn.Module):
    """Pre-norm decoder with seeded random weights (a pure function of ``cfg`` and the device).

    Weights are drawn on ``device`` from a generator seeded with ``cfg.seed``. The LM head runs
    in fp32, so logits are not rounded to ``cfg.dtype`` (a bf16 logit near 4 would be a multiple
    of 1/32): comparing two runs' logits then measures only what differs upstream.

    ``shard`` (default: one rank) makes this rank ``shard.rank`` of a tensor-parallel model: its
    weights are exact blocks of the one-rank model's (``hicache.model.shard``), its KV pool
    holds its block of the KV heads, and every rank computes the same logits. ``ValueError``
    when ``cfg`` does not split evenly over ``shard.size`` ranks.

    ``cfg.layer_pattern`` mixes full-attention (``F``), sliding-window (``S``) and linear (``L``)
    layers; ``hicache.model.make_model_pools`` builds the pools such a model reads.
    """

    def __init__(
        self, cfg: ModelConfig, device: torch.device | str = "cpu", shard: TPShard | None = None
    ) -> None:
        super().__init__()
        shard = TPShard() if shard is None else shard
        if not isinstance(shard, TPShard):
            raise TypeError(f"shard must be a TPShard or None, got {type(shard).__name__}")
        shard.check(cfg)
        self.cfg, self.device, self.shard = cfg, torch.device(device), shard
        gen = torch.Generator(device=self.device).manual_seed(cfg.seed)
        with torch.device(self.device):
            embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
            self.embed = nn.Parameter(embed.to(cfg.dtype), requires_grad=False)
            layers = (DecoderLayer(cfg, i, gen, shard) for i in range(cfg.num_layers))
            self.layers = nn.ModuleList(layers)
            self.norm = RMSNorm(cfg.hidden_size, cfg.dtype)
            self.lm_head = seeded_linear(cfg.hidden_size, cfg.vocab_size, gen, torch.float32)

    @torch.inference_mode()
    def forward(
        self,
        batch: ForwardBatch,
        pool: Any,
        all_logits: bool = False,
        states: HybridReqToTokenPool | None = None,
    ) -> torch.Tensor:
        """Run one extend/decode pass, writing every new token's KV into ``pool``.

        Parameters
        ----------
        pool : the attention layers' KV pool (``make_model_pools(...).kv``: MHA/MLA, or a
            composite for a hybrid pattern; None when every layer is ``L``).
        states : the ``HybridReqToTokenPool`` whose rows (``batch.req_pool_indices``) hold the
            ``L`` layers' state slots, which this pass advances; None without ``L`` layers.

        ``ValueError`` naming ``pool`` / ``states`` when one the layers need is missing.

        Returns
        -------
        ``[B, vocab]`` fp32 logits of each request's last new token, or with ``all_logits``
        ``[T, vocab]`` for every packed new token. On the model device.
        """
        ctx = ForwardContext.build(self.cfg, batch, pool, states)
        h = self.embed[batch.input_ids]
        for layer in self.layers:
            h = layer(h, ctx)
        if not all_logits:
            h = h[batch.last_index]
        logits: torch.Tensor = self.lm_head(self.norm(h).float())
        return logits
