"""The tiny transformer's configuration: one frozen, validated dataclass."""

from __future__ import annotations

from dataclasses import dataclass

import torch

ATTENTION_KINDS = ("mha", "mla")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a tiny decoder-only transformer with seeded random weights.

    Attributes
    ----------
    attention : ``"mha"`` (GQA over ``num_kv_heads``) or ``"mla"`` (one latent of
        ``kv_lora_rank + qk_rope_head_dim`` channels per token, shared by all heads).
    head_dim : per-head dim of q/k/v for MHA; for MLA the no-rope part of q/k and the v dim.
    intermediate_size : the SwiGLU MLP width (keep it small: "light MLPs").
    seed : weights are a pure function of (config, seed).
    """

    vocab_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 64
    attention: str = "mha"
    kv_lora_rank: int = 32
    qk_rope_head_dim: int = 8
    rope_theta: float = 10000.0
    dtype: torch.dtype = torch.float32
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "kv_lora_rank",
            "qk_rope_head_dim",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {self.attention!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2 or self.qk_rope_head_dim % 2:
            raise ValueError("head_dim and qk_rope_head_dim must be even (RoPE rotates pairs)")
        if not self.dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating dtype, got {self.dtype}")

    @property
    def hidden_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Channels stored per token per layer per KV head (MLA: the whole latent)."""
        if self.attention == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token takes over all layers."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        mha = 2 * self.num_kv_heads * self.head_dim
        return (self.kv_dim if self.attention == "mla" else mha) * elem * self.num_layers
