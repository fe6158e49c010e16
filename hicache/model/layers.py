"""Small building blocks: RMSNorm, rotary embeddings, a SwiGLU MLP, seeded linear layers."""

from __future__ import annotations

import torch
from torch import nn


class Linear(nn.Module):
    """A bias-free linear map ``y = x @ weight.T``."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight)


def seeded_linear(
    in_features: int,
    out_features: int,
    gen: torch.Generator,
    dtype: torch.dtype,
    rows: slice = slice(None),
    cols: slice = slice(None),
) -> Linear:
    """A :class:`Linear` with N(0, 1/in_features) weights drawn from ``gen`` on its device.

    The whole ``[out_features, in_features]`` weight is drawn (so ``gen`` advances the same
    for every shard) and only ``weight[rows, cols]`` is kept: a tensor-parallel shard's block.
    """
    weight = torch.randn(out_features, in_features, generator=gen, device=gen.device)
    return Linear((weight[rows, cols] / in_features**0.5).to(dtype).contiguous())


class RMSNorm(nn.Module):
    def __init__(self, dim: int, dtype: torch.dtype, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return x32.to(x.dtype) * self.weight


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``; a shard keeps the ``cols`` block of the ``inter``
    columns (gate/up column-parallel, down row-parallel: its output is a partial sum)."""

    def __init__(
        self,
        hidden: int,
        inter: int,
        gen: torch.Generator,
        dtype: torch.dtype,
        cols: slice = slice(None),
    ) -> None:
        super().__init__()
        self.gate = seeded_linear(hidden, inter, gen, dtype, rows=cols)
        self.up = seeded_linear(hidden, inter, gen, dtype, rows=cols)
        self.down = seeded_linear(inter, hidden, gen, dtype, cols=cols)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(nn.functional.silu(self.gate(x)) * self.up(x))
        return out


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate channel pairs of ``x`` by angles ``position * theta^(-2i/dim)`` (neox style).

    Parameters
    ----------
    x : ``[T, heads, dim]`` any float dtype, any device; ``dim`` even.
    positions : ``[T]`` int64 on ``x``'s device; absolute token positions.

    Returns
    -------
    ``[T, heads, dim]`` in ``x``'s dtype. Computed in fp32, so the result for a token depends
    only on its own values and position, never on the batch it came in.
    """
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x.float()[..., :half], x.float()[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
