"""Storage test fixtures: small host pools (MHA and MLA, every layout), keys, and a backend
factory parametrized over every embedded backend (a new backend joins ``BACKENDS``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hicache.backends import HiCacheStorage, KVFingerprint, StorageKeys, create_storage_backend
from hicache.pools.mha_pool import MHATokenToKVPool, MHATokenToKVPoolHost
from hicache.pools.mla_pool import MLATokenToKVPool, MLATokenToKVPoolHost
from hicache.radix.page_hash import namespace_seed, page_hashes

PAGE = 4
POISON = 0xA5
POOLS = [("mha", lay) for lay in MHATokenToKVPoolHost.layouts] + [
    ("mla", lay) for lay in MLATokenToKVPoolHost.layouts
]
# name -> extra_config for ``create_storage_backend``, given a fresh directory
BACKENDS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "memory": lambda tmp: {},
    "file": lambda tmp: {"root": str(tmp / "store"), "max_bytes": 1 << 30},
}


def make_host(kind: str, layout: str, page_size: int = PAGE, **dims: int) -> Any:
    """A host pool of 2x a 32-slot device pool (bfloat16, 3 layers), not pinned."""
    layers = dims.get("layers", 3)
    if kind == "mha":
        heads, dim = dims.get("heads", 2), dims.get("dim", 8)
        dev = MHATokenToKVPool(32, page_size, torch.bfloat16, heads, dim, layers, "cpu")
        return MHATokenToKVPoolHost(dev, 2.0, 0, page_size, layout, pin_memory=False)
    mla = MLATokenToKVPool(32, page_size, torch.bfloat16, 16, 8, layers, "cpu")
    return MLATokenToKVPoolHost(mla, 2.0, 0, page_size, layout, pin_memory=False)


def fingerprint(host: Any, **changes: Any) -> KVFingerprint:
    fields: dict[str, Any] = {
        "model_id": "test/model",
        "model_revision": "r1",
        "kv_dtype": str(host.dtype),
        "head_num": host.head_num,
        "head_dim": host.head_dim,
        "layer_num": host.layer_num,
        "page_size": host.page_size,
        "layout": host.layout,
        "is_mla": host.parts == 1,
    }
    return KVFingerprint(**(fields | changes))


def keys_for(host: Any, pages: int, namespace: Any = None, seed: int = 0, **fp: Any) -> list[str]:
    """Page keys of ``pages`` full pages of random token ids in ``namespace``."""
    ids = np.random.default_rng(seed).integers(0, 50_000, pages * host.page_size, np.int32)
    hashes = page_hashes(ids, host.page_size, namespace_seed(namespace))
    return StorageKeys(fingerprint(host, **fp)).page_keys(hashes)


def page_of(buf: torch.Tensor, layout: str, page_size: int, slot: int) -> torch.Tensor:
    """The oracle: the page at ``slot`` of one part buffer in ``layout`` (shapes as in
    ``hicache.pools.host_layouts``)."""
    if layout == "layer_first":  # (L, size, H, D)
        return buf[:, slot : slot + page_size]
    if layout == "page_first":  # (size, L, H, D)
        return buf[slot : slot + page_size]
    return buf[slot // page_size]  # (pages, ...)


def page_view(host: Any, part: int, slot: int) -> torch.Tensor:
    """The page at ``slot`` of ``host``'s part ``part``, as the layout stores it."""
    return page_of(host.host_parts[part], host.layout, host.page_size, slot)


def page_bytes(host: Any, slot: int) -> list[bytes]:
    """The bytes of every part of the page at ``slot``."""
    return [
        page_view(host, p, slot).contiguous().view(torch.uint8).numpy().tobytes()
        for p in range(host.parts)
    ]


def fill_random(host: Any, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for part in host.host_parts:
        raw = torch.randint(
            0, 256, (part.numel() * part.element_size(),), dtype=torch.uint8, generator=gen
        )
        part.view(torch.uint8).view(-1).copy_(raw)


def poison(host: Any) -> None:
    for part in host.host_parts:
        part.view(torch.uint8).fill_(POISON)


def slots(pages: list[int], page_size: int = PAGE) -> torch.Tensor:
    """Host slot indices of whole pages ``pages`` (page numbers), in order."""
    return (
        torch.cat([torch.arange(p * page_size, (p + 1) * page_size) for p in pages])
        if pages
        else torch.empty(0, dtype=torch.int64)
    )


@pytest.fixture(params=POOLS, ids=[f"{k}-{lay}" for k, lay in POOLS])
def host(request: pytest.FixtureRequest) -> Any:
    """A random-filled host pool of each kind and layout."""
    pool = make_host(*request.param)
    fill_random(pool, seed=1)
    return pool


@pytest.fixture(params=sorted(BACKENDS))
def backend_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., HiCacheStorage]]:
    """``make(host=None, **overrides)``: a new backend of each kind (all instances of one test
    share the file directory), registered with ``host`` when given; closed at teardown."""
    made: list[HiCacheStorage] = []

    def make(host: Any = None, **overrides: Any) -> HiCacheStorage:
        backend = create_storage_backend(
            request.param, BACKENDS[request.param](tmp_path) | overrides
        )
        if host is not None:
            backend.register_mem_pool_host(host)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()
