"""Host pools with random pages, poison and page byte views for the Mooncake tests."""

from __future__ import annotations

import uuid

import torch

from hicache.backends.pages import PageIO
from hicache.pools import (
    HostKVPool,
    MHATokenToKVPool,
    MHATokenToKVPoolHost,
    MLATokenToKVPool,
    MLATokenToKVPoolHost,
)

PAGE = 16
POISON = 0xA5


def host_pool(kind: str, layout: str, pages: int = 8, heads: int = 2, dim: int = 8) -> HostKVPool:
    """A ``kind`` (``mha``/``mla``) host pool of ``pages`` pages in ``layout``, random bytes."""
    size = pages * PAGE // 2  # the host pool holds twice the device pool
    if kind == "mha":
        device = MHATokenToKVPool(size, PAGE, torch.float16, heads, dim, 3, "cpu")
        pool: HostKVPool = MHATokenToKVPoolHost(device, 2.0, 0, PAGE, layout, pin_memory=False)
    else:
        device_mla = MLATokenToKVPool(size, PAGE, torch.bfloat16, 16, 8, 3, "cpu")
        pool = MLATokenToKVPoolHost(device_mla, 2.0, 0, PAGE, layout, pin_memory=False)
    return pool


def fill_random(pool: HostKVPool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for part in pool.host_parts:
        raw = part.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))


def poison(pool: HostKVPool) -> None:
    for part in pool.host_parts:
        part.view(torch.uint8).fill_(POISON)


def page_bytes(pool: HostKVPool, page: int) -> list[bytes]:
    """The bytes of each object of host page ``page``."""
    return [a.tobytes() for a in PageIO(pool).source(page * PAGE)]


def slots(pages: list[int]) -> torch.Tensor:
    """The host slots of ``pages``, as a batch call takes them."""
    return torch.tensor([p * PAGE + i for p in pages for i in range(PAGE)], dtype=torch.int64)


def fresh_keys(n: int) -> list[str]:
    """``n`` page keys no other test uses."""
    tag = uuid.uuid4().hex
    return [f"hc1_test_{tag}_{i}_r0of1" for i in range(n)]
