"""Helpers of the storage-tier tests: stacks over one storage directory, random KV, waiting."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch

from hicache import KVStack, build_kv_stack
from hicache.backends import HiCacheStorage, StorageConfig
from hicache.radix import HiCacheConfig, RadixKey

PAGE = 4
LAYERS = 2


# (mla, host layout, io_backend): every layout, each with a backend that serves it
CASES = [
    (False, "layer_first", "kernel"),
    (False, "page_first", "kernel"),
    (False, "page_head", "kernel"),
    (False, "page_first_direct", "direct"),
    (True, "layer_first", "kernel"),
    (True, "page_first", "kernel"),
]


def storage_config(root: Path | HiCacheStorage, **changes: Any) -> StorageConfig:
    """A file store under ``root`` (or the given backend), threshold one page, waiting."""
    fields: dict[str, Any] = {
        "backend": root if isinstance(root, HiCacheStorage) else "file",
        "extra_config": {} if isinstance(root, HiCacheStorage) else {"root": str(root)},
        "model_id": "test/tiny",
        "model_revision": "r1",
        "prefetch_threshold": PAGE,
        "prefetch_policy": "wait_complete",
    }
    return StorageConfig(**(fields | changes))


def make_stack(
    storage: StorageConfig,
    *,
    mla: bool = False,
    layout: str = "page_first",
    io_backend: str = "kernel",
    write_policy: str = "write_through",
    size: int = 256,
    ratio: float = 2.0,
    device: str = "cpu",
    tp_group: Any = None,
    verify: str = "off",
) -> KVStack:
    dims: dict[str, int] = (
        {"kv_lora_rank": 8, "qk_rope_head_dim": 4} if mla else {"head_num": 2, "head_dim": 4}
    )
    hicache = HiCacheConfig(
        hicache_ratio=ratio,
        mem_layout=layout,
        io_backend=io_backend,
        write_policy=write_policy,
        storage=storage,
        verify=verify,
    )
    return build_kv_stack(
        layer_num=LAYERS,
        dtype=torch.float32,
        size=size,
        max_requests=4,
        max_context_len=size,
        page_size=PAGE,
        device=device,
        hicache=hicache,
        tp_group=tp_group,
        **dims,
    )


def fill(stack: KVStack, slots: torch.Tensor, seed: int) -> None:
    """Random KV (never zeros) into ``slots`` of every layer and part."""
    gen = torch.Generator().manual_seed(seed)
    for part in stack.kv_pool.part_buffers:
        for layer in part:
            layer[slots] = (torch.rand(layer[slots].shape, generator=gen) + 0.5).to(layer.device)


def kv_of(stack: KVStack, slots: torch.Tensor) -> list[torch.Tensor]:
    return [layer[slots].clone() for part in stack.kv_pool.part_buffers for layer in part]


def write_prefix(stack: KVStack, ids: list[int], seed: int = 0, extra_key: Any = None) -> Any:
    """Insert ``ids`` with random KV and drain (host and storage); returns the KV."""
    slots = stack.allocator.alloc(len(ids))
    assert slots is not None
    fill(stack, slots, seed)
    stack.cache.insert(RadixKey(ids, extra_key), slots)
    stack.cache.drain_transfers()
    return kv_of(stack, slots)


def prefetch(cache: Any, req_id: str, ids: list[int], extra_key: Any = None) -> int:
    """Match ``ids``, prefetch the miss and wait for it; the tokens it inserted (-1: none
    started)."""
    m = cache.match_prefix(RadixKey(ids, extra_key))
    done = len(m.device_indices) + m.host_hit_length
    tail = RadixKey(ids[done:], extra_key)
    if not cache.prefetch_from_storage(req_id, m.last_host_node, tail):
        return -1
    wait_for(cache, req_id)
    return int(cache.pop_prefetch_loaded_tokens(req_id))


def wait_for(cache: Any, *req_ids: str) -> None:
    """Poll ``check_prefetch_progress`` until every one of ``req_ids`` may run (10 s bound)."""
    waiting, deadline = set(req_ids), time.monotonic() + 10
    while waiting:
        waiting = {r for r in waiting if not cache.check_prefetch_progress(r)}
        assert time.monotonic() < deadline, f"prefetches {waiting} did not finish"
        time.sleep(0.001)


def load(stack: KVStack, ids: list[int], extra_key: Any = None) -> tuple[int, torch.Tensor]:
    """Match ``ids`` and load its host part back; (host hit, device slots of the prefix)."""
    cache = stack.cache
    m = cache.match_prefix(RadixKey(ids, extra_key))
    loaded, _ = cache.init_load_back(m.last_host_node, m.host_hit_length)
    cache.consume_load_batch(cache.ready_to_load_host_cache())
    cache.drain_transfers()
    return m.host_hit_length, torch.cat([m.device_indices, loaded])


def random_ids(n: int, seed: int = 1) -> list[int]:
    """``n`` seeded random token ids (a prompt no other seed shares a page with)."""
    rng = random.Random(seed)
    return [rng.randrange(1, 30_000) for _ in range(n)]
