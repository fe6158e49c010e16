"""The stress "model": KV values derived from (token, position, layer), and readers for both tiers.

``kv_values`` is what a forward pass would have produced for a token; :func:`write_kv` stores it
with ``set_kv_buffer`` as the model does, and :func:`device_kv` / :func:`host_kv` read a slot
back from either tier in any host layout, so a checker can compare every cached token with the
value it must hold. Values are small integers (exact in float32, float16 and bfloat16) hashed
from the inputs channel by channel, so a slot holding another token's KV is caught with
certainty in practice.
"""

from __future__ import annotations

from typing import Any

import torch

_P = 2147483647  # Lehmer modulus (2**31 - 1)
_G = 48271


def _mix(x: torch.Tensor) -> torch.Tensor:
    """Two Lehmer steps of int64 ``x`` (values stay below 2**31, products below 2**47)."""
    x = (x % _P) * _G % _P
    return x * _G % _P


def kv_values(tokens: torch.Tensor, positions: torch.Tensor, layer: int, part: int,
              heads: int, dim: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """KV of part ``part`` (0 = K or the MLA latent, 1 = V) in ``layer`` for each token.

    Parameters
    ----------
    tokens, positions : int64 ``[n]`` (CPU): token ids and their positions in the sequence.
    salt : the namespace (a LoRA adapter changes the KV of the same tokens): KV of one token
        under two salts differs, so a hit across ``extra_key`` shows up as wrong bytes.

    Returns
    -------
    ``[n, heads, dim]`` CPU tensor of ``dtype``, integers in ``[-125, 125]``.
    """
    seed = (tokens * 1_000_003 + positions * 7919 + layer * 104_729 + part * 15_485_863
            + salt * 2_147_483)
    channel = torch.arange(heads * dim, dtype=torch.int64).view(1, heads, dim) * 2_654_435
    values = _mix(_mix(seed.view(-1, 1, 1) + 1) + channel) % 251 - 125
    return values.to(dtype)


def _parts(pool: Any) -> int:
    return 2 if hasattr(pool, "v_buffer") else 1


def _shape(pool: Any) -> tuple[int, int]:
    return (pool.head_num, pool.head_dim) if _parts(pool) == 2 else (1, pool.kv_dim)


def write_kv(pool: Any, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
             salt: int = 0) -> None:
    """Store every layer's KV of ``tokens`` at device ``slots`` (int64 ``[n]``) like a forward."""
    loc = slots.to(pool.device)
    for layer in range(pool.layer_num):
        parts = [expected_kv(pool, layer, p, tokens, positions, salt).to(pool.device)
                 for p in range(_parts(pool))]
        pool.set_kv_buffer(layer, loc, *parts)


def device_kv(pool: Any, layer: int, part: int, slots: torch.Tensor) -> torch.Tensor:
    """``[n, heads, dim]`` (CPU, ``dtype``) of device ``slots`` in ``layer``, read through the
    pool's getters as attention would: on CUDA the read waits for the consumer load batch."""
    buf = pool.get_key_buffer(layer) if part == 0 else pool.get_value_buffer(layer)
    return buf[slots.to(buf.device)].cpu()


def host_kv(host: Any, layer: int, part: int, slots: torch.Tensor) -> torch.Tensor:
    """``[n, heads, dim]`` (CPU, ``dtype``) of host ``slots`` in ``layer``, in any host layout."""
    buf = host.host_parts[part]
    buf = buf if host.store_dtype == host.dtype else buf.view(host.dtype)
    page, offset = slots // host.page_size, slots % host.page_size
    if host.layout == "layer_first":
        return buf[layer, slots]
    if host.layout == "page_first":
        return buf[slots, layer]
    if host.layout == "page_first_direct":
        return buf[page, layer, offset]
    return buf[page, :, offset, layer]  # page_head: [pages, H, page_size, L, D]


def expected_kv(pool: Any, layer: int, part: int, tokens: torch.Tensor,
                positions: torch.Tensor, salt: int = 0) -> torch.Tensor:
    """What :func:`write_kv` stored for these tokens (CPU, the pool's ``dtype``)."""
    heads, dim = _shape(pool)
    return kv_values(tokens, positions, layer, part, heads, dim, pool.dtype, salt)


def mismatches(pool: Any, read: Any, slots: torch.Tensor, tokens: torch.Tensor,
               positions: torch.Tensor, salt: int = 0) -> list[str]:
    """Every (layer, part) where ``read(layer, part, slots)`` differs from the expected KV."""
    bad = []
    for layer in range(pool.layer_num):
        for part in range(_parts(pool)):
            want = expected_kv(pool, layer, part, tokens, positions, salt)
            got = read(layer, part, slots)
            if not torch.equal(got, want):
                rows = (got != want).flatten(1).any(1).nonzero().flatten()[:4].tolist()
                bad.append(f"layer {layer} part {part}: slots {slots[rows].tolist()} differ")
    return bad
