"""A hybrid model's pools (``make_model_pools``) wired to a HiCacheController through a
``HybridKVPoolHost``, and byte-level helpers over a composite pool's global layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hicache.controller import HiCacheController
from hicache.model import ModelConfig
from hicache.model.hybrid_pools import ModelPools, make_model_pools
from hicache.pools import HybridKVPoolHost

POISON = 0xAB


@dataclass
class HybridRig:
    pools: ModelPools
    host: HybridKVPoolHost
    controller: HiCacheController

    @property
    def kv(self) -> Any:
        return self.pools.kv

    @property
    def allocator(self) -> Any:
        return self.pools.allocator


def config(pattern: str, kind: str = "mha") -> ModelConfig:
    return ModelConfig(
        num_layers=len(pattern),
        layer_pattern=pattern,
        attention=kind,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        kv_lora_rank=8,
        qk_rope_head_dim=4,
    )


def make_hybrid_rig(
    pattern: str,
    kind: str = "mha",
    io_backend: str = "kernel",
    layout: str = "layer_first",
    page_size: int = 1,
    *,
    pages: int = 6,
    swa_pages: int = 4,
    device: str = "cpu",
    **controller_kwargs: Any,
) -> HybridRig:
    """``pattern``'s pools (full pool of ``pages`` pages, SWA pool of ``swa_pages``), a host
    pool twice the full pool, and their controller."""
    size = pages * page_size
    pools = make_model_pools(
        config(pattern, kind), size, page_size, device, rows=2, swa_size=swa_pages * page_size
    )
    host = HybridKVPoolHost(pools.kv, 2.0, 0, page_size, layout)
    ctrl = HiCacheController(
        pools.allocator, host, page_size, io_backend=io_backend, **controller_kwargs
    )
    return HybridRig(pools, host, ctrl)


def every_buffer(kv: Any) -> list[torch.Tensor]:
    """Every layer buffer of every inner pool (raw bytes)."""
    return [
        layer.view(torch.uint8) for p in kv.inner_pools for part in p.part_buffers for layer in part
    ]


def fill_random(kv: Any, slots: torch.Tensor, seed: int) -> None:
    """Random bytes in every layer of every inner pool at its slots of allocator ``slots``."""
    gen = torch.Generator().manual_seed(seed)
    for pool, inner in zip(kv.inner_pools, kv.inner_slots(slots), strict=True):
        for part in pool.part_buffers:
            for layer in part:
                raw = layer.view(torch.uint8)
                shape = (inner.numel(), *raw.shape[1:])
                raw[inner] = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8).to(
                    raw.device
                )


def poison(kv: Any) -> None:
    for raw in every_buffer(kv):
        raw.fill_(POISON)


def layer_bytes(kv: Any, layer: int, slots: torch.Tensor) -> torch.Tensor:
    """Raw bytes (no counter wait) of global ``layer`` at allocator ``slots``: its inner pool's
    slots of them, every part."""
    index, is_swa = kv.layers_mapping[layer]
    pool, inner = kv.inner_pools[int(is_swa)], kv.inner_slots(slots)[int(is_swa)]
    return torch.cat([part[index].view(torch.uint8)[inner] for part in pool.part_buffers], -1)


def all_layer_bytes(kv: Any, slots: torch.Tensor) -> dict[int, torch.Tensor]:
    return {layer: layer_bytes(kv, layer, slots) for layer in sorted(kv.layers_mapping)}


def landed(kv: Any, want: dict[int, torch.Tensor], slots: torch.Tensor) -> list[int]:
    """The global layers whose bytes at ``slots`` are ``want``'s."""
    got = all_layer_bytes(kv, slots)
    return [layer for layer in want if torch.equal(got[layer], want[layer])]


def backed_up(
    rig: HybridRig, n: int, seed: int = 1
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Allocate ``n`` slots, fill them, back them up and free them; (host slots, the bytes)."""
    ctrl = rig.controller
    slots = rig.allocator.alloc(n)
    assert slots is not None
    fill_random(rig.kv, slots, seed)
    want = all_layer_bytes(rig.kv, slots)
    host = ctrl.write(slots, node_id=1)
    assert host is not None
    ctrl.start_writing()
    ctrl.drain()
    ctrl.evict_device(slots)
    return host, want
