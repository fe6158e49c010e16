"""The stress "model": KV values derived from (token, position, layer), and readers for both tiers.

``kv_values`` is what a forward pass would have produced for a token; :func:`write_kv` stores it
with ``set_kv_buffer`` as the model does, and :func:`device_kv` / :func:`host_kv` read a slot
back from either tier in any host layout, so a checker can compare every cached token with the
value it must hold. Values are small integers (exact in float32, float16 and bfloat16) hashed
from the inputs channel by channel, so a slot holding another token's KV is caught with
certainty in practice. Lookups go through a table of every (salt, token, position) seen so far
(one gather per batch instead of a dozen int64 ops per layer).

Under tensor parallelism each MHA rank process calls :func:`set_shard` with its rank first:
rank ``r`` holding ``heads`` heads then holds channels ``r * heads * dim ..`` of the whole
model's KV (its heads), so a slot filled with another rank's bytes (a storage key without the
rank) shows. MLA ranks hold the same latent and keep shard 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_P = 2147483647  # Lehmer modulus (2**31 - 1)
_G = 48271
_TABLE_CAP = 1 << 24  # most elements a table may hold; larger lookups are computed directly
_SHARD = [0]  # this process's TP rank (``set_shard``)


def set_shard(rank: int) -> None:
    """Make every value this process computes that of TP rank ``rank`` (>= 0)."""
    if not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an int >= 0, got {rank!r}")
    _SHARD[0] = rank
    _TABLES.clear()


def _mix(x: torch.Tensor) -> torch.Tensor:
    """Two Lehmer steps of int64 ``x`` (values stay below 2**31, products below 2**47)."""
    x = (x % _P) * _G % _P
    return x * _G % _P


def kv_values(
    tokens: torch.Tensor,
    positions: torch.Tensor,
    layer: int,
    part: int,
    heads: int,
    dim: int,
    dtype: torch.dtype,
    salt: int | torch.Tensor = 0,
) -> torch.Tensor:
    """KV of part ``part`` (0 = K or the MLA latent, 1 = V) in ``layer`` for each token.

    Parameters
    ----------
    tokens, positions : int64 ``[n]`` (CPU): token ids and their positions in the sequence.
    salt : the namespace (a LoRA adapter changes the KV of the same tokens), an int or an int64
        ``[n]``: KV of one token under two salts differs, so a hit across ``extra_key`` shows
        up as wrong bytes.

    Returns
    -------
    ``[n, heads, dim]`` CPU tensor of ``dtype``, integers in ``[-125, 125]``.
    """
    seed = (
        tokens * 1_000_003
        + positions * 7919
        + layer * 104_729
        + part * 15_485_863
        + salt * 2_147_483
    )
    first = _SHARD[0] * heads * dim  # this rank's first channel of the whole model's
    channel = torch.arange(first, first + heads * dim, dtype=torch.int64).view(1, heads, dim)
    channel = channel * 2_654_435
    values = _mix(_mix(seed.view(-1, 1, 1) + 1) + channel) % 251 - 125
    return values.to(dtype)


def _parts(pool: Any) -> int:
    return 2 if hasattr(pool, "v_buffer") else 1


def _shape(pool: Any) -> tuple[int, int]:
    return (pool.head_num, pool.head_dim) if _parts(pool) == 2 else (1, pool.kv_dim)


class _Table:
    """``kv_values`` of one pool geometry for every (salt, token, position) below ``bounds``.

    ``values`` is ``[salts * tokens * positions, layers * parts, heads, dim]`` (row
    ``(salt * tokens + token) * positions + position``), computed whole when a lookup goes past
    ``bounds`` (which then at least double): index arithmetic runs in numpy, a lookup is one
    torch gather.
    """

    def __init__(self, layers: int, parts: int, heads: int, dim: int, dtype: torch.dtype) -> None:
        self.layers, self.parts, self.heads, self.dim, self.dtype = layers, parts, heads, dim, dtype
        self.bounds: tuple[int, ...] = (0, 0, 0)  # (salts, tokens, positions) covered
        self.values = torch.empty(0, layers * parts, heads, dim, dtype=dtype)

    def direct(self, tokens: np.ndarray, positions: np.ndarray, salts: np.ndarray) -> torch.Tensor:
        t, p, s = (torch.from_numpy(x) for x in (tokens, positions, salts))
        return torch.stack(
            [
                kv_values(t, p, layer, part, self.heads, self.dim, self.dtype, s)
                for layer in range(self.layers)
                for part in range(self.parts)
            ],
            1,
        )

    def lookup(self, tokens: np.ndarray, positions: np.ndarray, salts: np.ndarray) -> torch.Tensor:
        """``[n, layers * parts, heads, dim]`` for int64 ``[n]`` inputs."""
        if tokens.size == 0:
            return self.direct(tokens, positions, salts)
        columns = np.stack((salts, tokens, positions))
        if int(columns.min()) < 0:
            return self.direct(tokens, positions, salts)
        need = tuple(n + 1 for n in columns.max(axis=1).tolist())
        fits = all(n <= b for n, b in zip(need, self.bounds, strict=True))
        if not (fits or self._grow(need)):
            return self.direct(tokens, positions, salts)
        _, t, p = self.bounds
        return self.values[torch.from_numpy((salts * t + tokens) * p + positions)]

    def _grow(self, need: tuple[int, ...]) -> bool:
        bounds = tuple(
            b if n <= b else max(2 * b, -(-n // q) * q)  # salts: few, exact
            for n, b, q in zip(need, self.bounds, (1, 16, 16), strict=True)
        )
        if np.prod(bounds) * self.layers * self.parts * self.heads * self.dim > _TABLE_CAP:
            return False
        grid = np.indices(bounds).reshape(3, -1)
        self.values, self.bounds = self.direct(grid[1], grid[2], grid[0]), bounds
        return True


_TABLES: dict[tuple[Any, ...], _Table] = {}


def _int64(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return np.asarray(x.numpy() if isinstance(x, torch.Tensor) else x, dtype=np.int64)


def expected_rows(
    pool: Any,
    tokens: torch.Tensor | np.ndarray,
    positions: torch.Tensor | np.ndarray,
    salt: int | torch.Tensor | np.ndarray = 0,
) -> torch.Tensor:
    """What :func:`write_kv` stored for these tokens, every layer and part at once: CPU
    ``[n, layers * parts, heads, dim]`` of the pool's ``dtype`` (index ``layer * parts + part``).
    ``tokens``, ``positions`` : integer ``[n]`` (CPU tensors or numpy); ``salt`` an int or an
    integer ``[n]`` (one namespace per row)."""
    heads, dim = _shape(pool)
    key = (pool.layer_num, _parts(pool), heads, dim, pool.dtype)
    table = _TABLES.get(key)
    if table is None:
        table = _TABLES[key] = _Table(*key)
    tokens = _int64(tokens)
    salts = np.full_like(tokens, salt) if isinstance(salt, int) else _int64(salt)
    return table.lookup(tokens, _int64(positions), salts)


def expected_kv(
    pool: Any,
    layer: int,
    part: int,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    salt: int | torch.Tensor = 0,
) -> torch.Tensor:
    """What :func:`write_kv` stored for these tokens in one (layer, part) (CPU, ``dtype``)."""
    return expected_rows(pool, tokens, positions, salt)[:, layer * _parts(pool) + part]


def write_kv(
    pool: Any, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, salt: int = 0
) -> None:
    """Store every layer's KV of ``tokens`` at device ``slots`` (int64 ``[n]``) like a forward."""
    loc, parts = slots.to(pool.device), _parts(pool)
    rows = expected_rows(pool, tokens, positions, salt).to(pool.device)
    for layer in range(pool.layer_num):
        pool.set_kv_buffer(layer, loc, *rows[:, layer * parts : (layer + 1) * parts].unbind(1))


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


def device_rows(pool: Any, slots: torch.Tensor) -> torch.Tensor:
    """Every layer and part of device ``slots`` at once, like :func:`expected_rows`: CPU
    ``[n, layers * parts, heads, dim]``, read through the pool's getters (one wait per layer)."""
    loc, columns = slots.to(pool.device), []
    for layer in range(pool.layer_num):
        parts = pool.get_kv_buffer(layer) if _parts(pool) == 2 else (pool.get_key_buffer(layer),)
        columns += [buf[loc] for buf in parts]
    return torch.stack(columns, 1).cpu()


def host_rows(host: Any, slots: torch.Tensor) -> torch.Tensor:
    """Every layer and part of host ``slots`` at once (one gather per part), in any host
    layout: CPU ``[n, layers * parts, heads, dim]`` like :func:`expected_rows`."""
    page, offset, parts = slots // host.page_size, slots % host.page_size, []
    for buf in host.host_parts:
        buf = buf if host.store_dtype == host.dtype else buf.view(host.dtype)
        if host.layout == "layer_first":  # [L, slots, H, D]
            parts.append(buf[:, slots].transpose(0, 1))
        elif host.layout == "page_first":  # [slots, L, H, D]
            parts.append(buf[slots])
        elif host.layout == "page_first_direct":  # [pages, L, page_size, H, D]
            parts.append(buf[page, :, offset])
        else:  # page_head: [pages, H, page_size, L, D]
            parts.append(buf[page, :, offset].transpose(1, 2))
    return torch.stack(parts, 2).flatten(1, 2)


def differences(pool: Any, got: torch.Tensor, want: torch.Tensor, slots: torch.Tensor) -> list[str]:
    """Every (layer, part) where rows ``got`` and ``want`` (``[n, layers * parts, ...]``) of
    ``slots`` differ."""
    if torch.equal(got, want):
        return []
    parts, bad = _parts(pool), []
    for column in range(want.shape[1]):
        wrong = (got[:, column] != want[:, column]).flatten(1).any(1)
        if bool(wrong.any()):
            rows = wrong.nonzero().flatten()[:4].tolist()
            bad.append(
                f"layer {column // parts} part {column % parts}: slots "
                f"{slots[rows].tolist()} differ"
            )
    return bad


def mismatches(
    pool: Any,
    read: Any,
    slots: torch.Tensor,
    tokens: Any,
    positions: Any,
    salt: int | torch.Tensor | np.ndarray = 0,
) -> list[str]:
    """Every (layer, part) where ``read(layer, part, slots)`` differs from the expected KV of
    ``tokens`` at ``positions``."""
    if slots.numel() == 0:
        return []
    layers, parts = range(pool.layer_num), range(_parts(pool))
    got = torch.stack([read(layer, part, slots) for layer in layers for part in parts], 1)
    return differences(pool, got, expected_rows(pool, tokens, positions, salt), slots)
