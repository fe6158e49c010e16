"""Small real pools wired to a HiCacheController, and byte-level KV fill/read helpers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hicache.controller import HiCacheController
from hicache.pools import (
    MHATokenToKVPool,
    MHATokenToKVPoolHost,
    MLATokenToKVPool,
    MLATokenToKVPoolHost,
    TokenToKVPoolAllocator,
)

LAYERS = 3


@dataclass
class Rig:
    allocator: TokenToKVPoolAllocator
    device_pool: Any
    host_pool: Any
    controller: HiCacheController


def make_device_pool(
    kind: str, size: int, page_size: int, device: str, layers: int, heads: int, dim: int
) -> Any:
    """MHA: float32 ``[slots, heads, dim]`` K and V; MLA: bf16 latent of ``dim + 4`` channels."""
    if kind == "mha":
        return MHATokenToKVPool(size, page_size, torch.float32, heads, dim, layers, device)
    return MLATokenToKVPool(size, page_size, torch.bfloat16, dim, 4, layers, device)


def make_rig(
    kind: str = "mha",
    io_backend: str = "kernel",
    layout: str = "layer_first",
    page_size: int = 1,
    pages: int = 4,
    *,
    device: str = "cpu",
    layers: int = LAYERS,
    heads: int = 2,
    dim: int = 8,
    ratio: float = 2.0,
    **controller_kwargs: Any,
) -> Rig:
    """Device pool of ``pages`` pages, host pool ``ratio`` times larger, and their controller."""
    size = pages * page_size
    device_pool = make_device_pool(kind, size, page_size, device, layers, heads, dim)
    allocator = TokenToKVPoolAllocator(size, page_size, device, kvcache=device_pool)
    host_cls = MHATokenToKVPoolHost if kind == "mha" else MLATokenToKVPoolHost
    host_pool = host_cls(device_pool, ratio, 0, page_size, layout)
    controller = HiCacheController(
        allocator, host_pool, page_size, io_backend=io_backend, **controller_kwargs
    )
    return Rig(allocator, device_pool, host_pool, controller)


def fill_random(device_pool: Any, indices: torch.Tensor, seed: int) -> None:
    """Random bytes (made on the pool's device) in every layer and part at slots ``indices``."""
    gen = torch.Generator(device=device_pool.device).manual_seed(seed)
    for part in device_pool.part_buffers:
        for layer in part:
            raw = layer.view(torch.uint8)
            shape = (indices.numel(), *raw.shape[1:])
            raw[indices] = torch.randint(
                0, 256, shape, generator=gen, dtype=torch.uint8, device=raw.device
            )


def poison(device_pool: Any, byte: int = 0xAB) -> None:
    """Overwrite every byte of every device layer buffer (stale data a load must replace)."""
    for part in device_pool.part_buffers:
        for layer in part:
            layer.view(torch.uint8).fill_(byte)


def read_layer(device_pool: Any, layer: int, indices: torch.Tensor) -> torch.Tensor:
    """Bytes of layer ``layer`` at ``indices`` (K then V), read through the pool's getters.

    The getters call the registered counter's ``wait_until(layer)`` first, so on CUDA the copy
    is queued on the current stream after the wait for the consumer batch's layer.
    """
    parts = [device_pool.get_key_buffer(layer)]
    if hasattr(device_pool, "v_buffer"):
        parts.append(device_pool.get_value_buffer(layer))
    return torch.cat([p[indices].contiguous().view(torch.uint8) for p in parts], dim=-1)


def read_bytes(device_pool: Any, indices: torch.Tensor) -> list[torch.Tensor]:
    """:func:`read_layer` for every layer, in layer order (on the pool's device)."""
    return [read_layer(device_pool, layer, indices) for layer in range(device_pool.layer_num)]


def assert_same_bytes(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), f"layer {layer}: KV bytes differ"


def slot_counts(rig: Rig) -> tuple[int, int]:
    return rig.allocator.available_size(), rig.host_pool.available_size()
