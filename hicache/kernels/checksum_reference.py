"""The page hash in plain torch: its constants, one call's geometry and the reference checksums.

:mod:`hicache.kernels.checksum` defines the hash; the Triton kernel
(:mod:`hicache.kernels.checksum_kernel`) computes the same values on the GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

KEY_MUL, KEY_ADD = 0x61C88647, 0x1B873593
A1, B1, A2, B2 = 0x7FEB352D, 0x2C1B3C6D, 0x6A09E667, 0x3C6EF373
TORCH_WORDS = {4: torch.int32, 2: torch.int16, 1: torch.int8}  # word bytes -> dtype read as
_M32 = (1 << 32) - 1


@dataclass(frozen=True)
class PageGeometry:
    """The layers of one call: ``parts`` (K and V, or the latent) of ``layers`` tensors each,
    ``slots`` items of ``item_bytes`` bytes per tensor, on ``device``."""

    parts: int
    layers: int
    slots: int
    item_bytes: int
    device: torch.device

    @property
    def word(self) -> int:
        """Bytes per hashed word: 4 when the item size allows, else 2 or 1."""
        return 4 if self.item_bytes % 4 == 0 else 2 if self.item_bytes % 2 == 0 else 1


def _mix(x: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """The 32-bit finalizer on int64 lanes holding values < 2**32 (products stay < 2**63)."""
    x = x ^ (x >> 16)
    x = (x * a) & _M32
    x = x ^ (x >> 15)
    x = (x * b) & _M32
    return x ^ (x >> 16)


def reference_checksums(
    geo: PageGeometry,
    layers: Sequence[Sequence[torch.Tensor]],
    indices: torch.Tensor,
    page_size: int,
) -> torch.Tensor:
    """int64 ``[pages, layers]`` checksums of ``indices``' pages, on ``geo.device``."""
    pages, word = indices.numel() // page_size, geo.word
    per_item = geo.item_bytes // word
    n = geo.parts * page_size * per_item
    key = (torch.arange(n, device=geo.device) * KEY_MUL) & _M32
    key2 = (key + KEY_ADD) & _M32
    out = torch.empty((pages, geo.layers), dtype=torch.int64, device=geo.device)
    for layer in range(geo.layers):
        parts = [
            part[layer][indices].view(torch.uint8).reshape(pages, page_size, geo.item_bytes)
            for part in layers
        ]
        words = torch.stack(parts, 1).view(TORCH_WORDS[word]).reshape(pages, n)
        w = words.to(torch.int64) & ((1 << 8 * word) - 1)
        s1 = _mix(w ^ key, A1, B1).sum(1) & _M32
        s2 = _mix(w ^ key2, A2, B2).sum(1) & 0x7FFFFFFF
        out[:, layer] = s1 + (s2 << 32)
    return out
