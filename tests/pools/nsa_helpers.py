"""Helpers for the NSA pool tests: a small pool, random index inputs, and SGLang's index-K
layout computed byte by byte on its own (no code shared with ``hicache.pools.nsa_index``)."""

from __future__ import annotations

import torch

from hicache.pools import NSATokenToKVPool
from tests.pools.helpers import random_like

PAGE, HEAD = 64, 128
ROW = PAGE * HEAD + PAGE * 4  # one page: 64 keys of 128 bytes, then 64 fp32 scales


class FakeCounter:
    def __init__(self) -> None:
        self.waits: list[int] = []

    def wait_until(self, layer_id: int) -> None:
        self.waits.append(layer_id)


def nsa_pool(device: str = "cpu", layers: int = 2, size: int = 128) -> NSATokenToKVPool:
    return NSATokenToKVPool(size, PAGE, 16, torch.bfloat16, 8, layers, device, 128)


def index_inputs(n: int, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    keys = random_like(torch.empty(n, HEAD, dtype=torch.float8_e4m3fn), gen)
    scales = torch.rand(n, generator=gen) + 0.5
    return keys.to(device), scales.to(device)


def slot_ranges(slot: int) -> tuple[slice, slice]:
    """SGLang's layout: the flat byte ranges of ``slot``'s key and scale. Page ``slot // 64``
    starts at ``page * ROW``; the key at ``+ (slot % 64) * 128``, the scale at ``+ 64 * 128 +
    (slot % 64) * 4``."""
    base, offset = slot // PAGE * ROW, slot % PAGE
    key = slice(base + offset * HEAD, base + (offset + 1) * HEAD)
    scale = slice(base + PAGE * HEAD + offset * 4, base + PAGE * HEAD + offset * 4 + 4)
    return key, scale


def reference_write(buf: torch.Tensor, loc: list[int], keys: torch.Tensor, scales: torch.Tensor):
    """``buf`` (CPU) with slots ``loc`` set to ``keys`` and ``scales``."""
    flat = buf.flatten()
    key_bytes, scale_bytes = keys.cpu().view(torch.uint8), scales.cpu().view(torch.uint8)
    for i, slot in enumerate(loc):
        key, scale = slot_ranges(slot)
        flat[key], flat[scale] = key_bytes[i], scale_bytes[4 * i : 4 * i + 4]
    return flat.view(buf.shape)


def reference_read(buf: torch.Tensor, seq_len: int, pages: list[int]):
    """Keys ``[seq_len, 128]`` and scales ``[seq_len, 4]`` of a sequence: its token ``t`` is slot
    ``pages[t // 64] * 64 + t % 64``."""
    flat = buf.cpu().flatten()
    keys, scales = [torch.empty(0, HEAD, dtype=torch.uint8)], [torch.empty(0, 4, dtype=torch.uint8)]
    for t in range(seq_len):
        key, scale = slot_ranges(pages[t // PAGE] * PAGE + t % PAGE)
        keys.append(flat[key][None])
        scales.append(flat[scale][None])
    return torch.cat(keys), torch.cat(scales)
