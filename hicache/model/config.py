"""The tiny transformer's configuration: one frozen, validated dataclass."""

from __future__ import annotations

from dataclasses import dataclass

import torch

ATTENTION_KINDS = ("mha", "mla")
LAYER_KINDS = "FSL"  # full attention, sliding-window attention, linear recurrence


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
    layer_pattern : one letter per layer (``num_layers`` of them), or ``""`` (every layer
        ``F``): ``F`` full attention, ``S`` sliding-window attention (a query at position ``p``
        sees keys ``p - sliding_window < j <= p``, HF's ``sliding_window``), ``L`` a linear
        recurrence (``hicache.model.linear``). ``attention`` applies to ``F`` and ``S`` layers.
    sliding_window : keys an ``S`` layer's query sees, itself included.
    conv_kernel : inputs of an ``L`` layer's causal depthwise conv (its state keeps
        ``conv_kernel - 1``; at least 2).
    linear_state_size : ``N`` of an ``L`` layer's ``[num_heads, head_dim, N]`` fp32 state.
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
    layer_pattern: str = ""
    sliding_window: int = 16
    conv_kernel: int = 4
    linear_state_size: int = 8

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
            "sliding_window",
            "linear_state_size",
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
        if self.conv_kernel < 2:
            raise ValueError(f"conv_kernel must be >= 2, got {self.conv_kernel}")
        self._check_pattern()

    def _check_pattern(self) -> None:
        pattern = self.layer_pattern
        if not isinstance(pattern, str):
            raise TypeError(f"layer_pattern must be a str, got {type(pattern).__name__}")
        if set(pattern) - set(LAYER_KINDS):
            raise ValueError(f"layer_pattern must use only {LAYER_KINDS!r}, got {pattern!r}")
        if pattern and len(pattern) != self.num_layers:
            raise ValueError(
                f"layer_pattern must have num_layers={self.num_layers} letters (or be empty), "
                f"got {pattern!r}"
            )

    @property
    def layer_kinds(self) -> str:
        """One of ``F``/``S``/``L`` per layer (``layer_pattern``, or all ``F``)."""
        return self.layer_pattern or "F" * self.num_layers

    def layers_of(self, kinds: str) -> list[int]:
        """Ids of the layers whose kind is one of ``kinds`` (e.g. ``"FS"``: every attention
        layer), ascending."""
        return [i for i, kind in enumerate(self.layer_kinds) if kind in kinds]

    @property
    def is_hybrid(self) -> bool:
        """Whether some layer is not full attention (``S`` or ``L``)."""
        return set(self.layer_kinds) != {"F"}

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
        """Bytes of KV cache one token takes over all attention (``F`` and ``S``) layers."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        mha = 2 * self.num_kv_heads * self.head_dim
        return (self.kv_dim if self.attention == "mla" else mha) * elem * len(self.layers_of("FS"))
