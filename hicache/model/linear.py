"""A small linear-recurrent layer (Mamba2 / gated-delta-net-like) whose state lives in a MambaPool.

Per token ``t`` of a request, with ``H`` heads of ``P`` channels and state size ``N``:

- ``u_t = silu(conv(x))_t``: a causal depthwise conv over the last ``K`` inputs ``x`` (the
  conv state keeps the ``K - 1`` inputs before the new tokens);
- ``h_t = a_t * h_{t-1} + u_t B_t^T`` per head (``h``: ``[P, N]``, fp32; ``a_t`` in (0, 1) a
  per-head decay gate), ``y_t = h_t C_t``;
- the output is ``out_proj(y * silu(z))``.

A request's conv and temporal state sit in its ``MambaPool`` slot: a forward reads them, runs
the new tokens and writes them back, so any split of a prompt into chunks gives the same
result. Within a chunk the recurrence runs in blocks of ``BLOCK`` tokens in its parallel
(quadratic) form, exact in fp32 up to rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hicache.model.config import ModelConfig
from hicache.model.context import ForwardContext
from hicache.model.layers import seeded_linear
from hicache.model.shard import TPShard

BLOCK = 64


class LinearRecurrence(nn.Module):
    """``num_heads`` heads of ``head_dim`` channels, state ``[head_dim, linear_state_size]``
    each; a tensor-parallel shard keeps its block of the heads (the conv its channels)."""

    def __init__(
        self, cfg: ModelConfig, layer_id: int, gen: torch.Generator, shard: TPShard
    ) -> None:
        super().__init__()
        self.cfg, self.layer_id, self.shard = cfg, layer_id, shard
        self.heads = cfg.num_heads // shard.size
        hidden, h, d = cfg.hidden_size, cfg.num_heads, cfg.hidden_size
        n, dt, rows = cfg.linear_state_size, cfg.dtype, shard.part(d)
        self.x_proj = seeded_linear(hidden, d, gen, dt, rows=rows)
        self.z_proj = seeded_linear(hidden, d, gen, dt, rows=rows)
        self.b_proj = seeded_linear(hidden, h * n, gen, dt, rows=shard.part(h * n))
        self.c_proj = seeded_linear(hidden, h * n, gen, dt, rows=shard.part(h * n))
        self.a_proj = seeded_linear(hidden, h, gen, dt, rows=shard.part(h))
        conv = torch.randn(d, cfg.conv_kernel, generator=gen, device=gen.device)
        conv = conv[rows] / cfg.conv_kernel**0.5
        self.conv_weight = nn.Parameter(conv.to(dt).contiguous(), requires_grad=False)
        self.out_proj = seeded_linear(d, hidden, gen, dt, cols=rows)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``x``: ``[T, hidden]`` -> ``[T, hidden]``; advances each request's state in place."""
        state = ctx.layer_state(self.layer_id)
        slots = ctx.state_slots
        assert slots is not None, "built for models with L layers"
        t, heads = x.shape[0], self.heads
        xs = self.x_proj(x)
        b = self.b_proj(x).float().view(t, heads, -1)
        c = self.c_proj(x).float().view(t, heads, -1)
        log_a = F.logsigmoid(self.a_proj(x).float())
        conv, temporal = state.conv[0][slots], state.temporal[slots]
        ys, convs, hs = [], [], []
        for i, seg in enumerate(ctx.batch.segments):
            span = slice(seg.start, seg.end)
            u, conv_i = causal_conv(xs[span], conv[i], self.conv_weight)
            y, h = scan(
                u.float().view(u.shape[0], heads, -1), b[span], c[span], log_a[span], temporal[i]
            )
            ys.append(y)
            convs.append(conv_i)
            hs.append(h)
        state.conv[0][slots] = torch.stack(convs)
        state.temporal[slots] = torch.stack(hs).to(state.temporal.dtype)
        y = torch.cat(ys).reshape(t, -1).to(x.dtype) * F.silu(self.z_proj(x))
        return self.shard.all_reduce(self.out_proj(y))


def causal_conv(
    x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu`` of the causal depthwise conv of ``x`` continuing from ``state``.

    Parameters
    ----------
    x : ``[n, d]`` new inputs.
    state : ``[d, K - 1]`` the ``K - 1`` inputs before them (zeros for a new request).
    weight : ``[d, K]``; output ``t`` is ``sum_k weight[:, k] * input[t - K + 1 + k]``.

    Returns
    -------
    ``([n, d] outputs, [d, K - 1] the state after x)``, in ``x``'s dtype.
    """
    k = weight.shape[1]
    window = torch.cat([state.to(x.dtype), x.T], dim=1)
    out = (window.unfold(1, k, 1) * weight[:, None, :]).sum(-1)
    return F.silu(out.T), window[:, window.shape[1] - (k - 1) :]


def scan(
    u: torch.Tensor, b: torch.Tensor, c: torch.Tensor, log_a: torch.Tensor, h: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated linear recurrence over ``n`` tokens from state ``h``, in blocks of ``BLOCK``.

    Parameters
    ----------
    u : ``[n, H, P]``, b, c : ``[n, H, N]``, log_a : ``[n, H]`` (``log a_t <= 0``), fp32.
    h : ``[H, P, N]`` the state before the tokens.

    Returns
    -------
    ``([n, H, P] outputs y, [H, P, N] the state after the last token)``, fp32.
    """
    ys = []
    h = h.float()
    for s in range(0, u.shape[0], BLOCK):
        block = slice(s, s + BLOCK)
        y, h = _scan_block(u[block], b[block], c[block], log_a[block], h)
        ys.append(y)
    return torch.cat(ys), h


def _scan_block(
    u: torch.Tensor, b: torch.Tensor, c: torch.Tensor, log_a: torch.Tensor, h: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`scan` of one block in its parallel form: with ``L_t = sum_{r<=t} log a_r``,
    ``y_t = e^{L_t} h C_t + sum_{s<=t} e^{L_t - L_s} (C_t . B_s) u_s``."""
    cum = log_a.cumsum(0)  # [n, H]
    n = u.shape[0]
    causal = torch.ones(n, n, dtype=torch.bool, device=u.device).tril()[..., None]
    decay = torch.where(causal, cum[:, None, :] - cum[None, :, :], -torch.inf).exp()
    scores = torch.einsum("thn,shn->tsh", c, b) * decay  # [t, s, H]
    y = torch.einsum("tsh,shp->thp", scores, u)
    y = y + torch.einsum("hpn,thn->thp", h, c) * cum.exp()[..., None]
    tail = (cum[-1:] - cum).exp()  # [s, H]: decay from token s to the block's end
    h = h * cum[-1].exp()[:, None, None] + torch.einsum("sh,shp,shn->hpn", tail, u, b)
    return y, h
