"""Every layout x io_backend round trip through the host pools, byte-exact, MHA and MLA."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from hicache.pools import (
    SUPPORTED_PAIRS,
    KVPool,
    MHATokenToKVPoolHost,
    MLATokenToKVPoolHost,
)
from hicache.pools.host_pool import HostKVPool
from tests.pools.helpers import (
    DEVICES,
    DTYPES,
    POISON,
    as_bytes,
    fill_random,
    mha_pool,
    mla_pool,
    poison,
)

KINDS = {"mha": (mha_pool, MHATokenToKVPoolHost), "mla": (mla_pool, MLATokenToKVPoolHost)}
PAIRS = [
    (kind, layout, backend)
    for kind in KINDS
    for backend, layouts in SUPPORTED_PAIRS.items()
    for layout in layouts
    if not (kind == "mla" and layout == "page_head")
]


def host_index(host: HostKVPool, layer: int, slots: torch.Tensor) -> tuple:
    """Index into one part of the host buffer selecting ``[len(slots), H, D]`` of one layer."""
    page, off = slots // host.page_size, slots % host.page_size
    return {
        "layer_first": (layer, slots),
        "page_first": (slots, layer),
        "page_first_direct": (page, layer, off),
        "page_head": (page, slice(None), off, layer),
    }[host.layout]


def scattered_pages(
    num_pages: int, first: int, count: int, page_size: int, seed: int
) -> torch.Tensor:
    """``count`` distinct random pages of ``[first, first + num_pages)`` as slot indices."""
    gen = torch.Generator().manual_seed(seed)
    pages = torch.randperm(num_pages, generator=gen)[:count] + first
    return (pages[:, None] * page_size + torch.arange(page_size)).flatten()


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def build(
    kind: str, layout: str, page_size: int, dtype: torch.dtype, device: str
) -> tuple[KVPool, HostKVPool]:
    make_device, make_host = KINDS[kind]
    dev = make_device(size=4 * page_size, page_size=page_size, dtype=dtype, device=device)
    return dev, make_host(dev, 2.0, 0, page_size, layout)


def round_trip(
    kind: str,
    layout: str,
    backend: str,
    page_size: int,
    dtype: torch.dtype,
    device: str,
    to_index: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
) -> None:
    """Back up 2 scattered device pages to 2 scattered host pages, then load them layer by layer
    into the 2 other device pages; copied bytes match, every other byte keeps its poison."""
    dev, host = build(kind, layout, page_size, dtype, device)
    fill_random([layer for part in dev.part_buffers for layer in part], seed=page_size)
    original = [[as_bytes(layer).cpu().clone() for layer in part] for part in dev.part_buffers]
    src = scattered_pages(4, 1, 2, page_size, seed=1)
    h = scattered_pages(8, 0, 2, page_size, seed=2)
    dst_pages = [p for p in (4, 3, 2, 1) if p * page_size not in src.tolist()]
    dst = (torch.tensor(dst_pages)[:, None] * page_size + torch.arange(page_size)).flatten()

    poison(host.kv_buffer)
    host.backup_from_device_all_layer(dev, to_index(h), to_index(src.to(device)), backend)
    synchronize(device)  # the CPU reads host memory a CUDA kernel wrote
    check_backup(host, original, src, h)
    fill_random([host.kv_buffer], seed=0)
    host.backup_from_device_all_layer(dev, to_index(h), to_index(src.to(device)), backend)
    synchronize(device)
    for layer in (layer for part in dev.part_buffers for layer in part):
        poison(layer)
    for layer in range(dev.layer_num):
        host.load_to_device_per_layer(dev, to_index(h), to_index(dst), layer, backend)
        check_load(dev, layer, [o[layer][src] for o in original], dst)


def check_backup(
    host: HostKVPool, original: list[list[torch.Tensor]], src: torch.Tensor, h: torch.Tensor
) -> None:
    """Host slots ``h`` hold device slots ``src`` in every layer; nothing else was written."""
    for p, part in enumerate(host.host_parts):
        host_bytes = part.view(torch.uint8)
        for layer in range(host.layer_num):
            index = host_index(host, layer, h)
            assert torch.equal(host_bytes[index], original[p][layer][src]), (p, layer)
            host_bytes[index] = POISON
    assert (as_bytes(host.kv_buffer) == POISON).all()


def check_load(dev: KVPool, layer: int, expected: list[torch.Tensor], dst: torch.Tensor) -> None:
    """Layer ``layer`` holds ``expected`` at ``dst`` and poison elsewhere; the next layer is
    still untouched."""
    untouched = torch.ones(dev.num_slots, dtype=torch.bool)
    untouched[dst] = False
    for part, want in zip(dev.part_buffers, expected, strict=True):
        got = as_bytes(part[layer]).cpu()
        assert torch.equal(got[dst], want)
        assert (got[untouched] == POISON).all()
        if layer + 1 < dev.layer_num:
            assert (as_bytes(part[layer + 1]) == POISON).all()


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize(("kind", "layout", "backend"), PAIRS)
def test_round_trip_page_sizes(kind: str, layout: str, backend: str, page_size: int) -> None:
    round_trip(kind, layout, backend, page_size, torch.float16, "cpu")


@pytest.mark.parametrize("dtype", DTYPES[1:])
@pytest.mark.parametrize(("kind", "layout", "backend"), PAIRS)
def test_round_trip_dtypes(kind: str, layout: str, backend: str, dtype: torch.dtype) -> None:
    round_trip(kind, layout, backend, 16, dtype, "cpu")


def test_unsupported_pair_at_call_changes_nothing() -> None:
    dev, host = build("mha", "page_first", 16, torch.float16, "cpu")
    poison(host.kv_buffer)
    idx = torch.arange(16)
    for backend in ("direct", "dma"):
        with pytest.raises(ValueError, match="io_backend"):
            host.backup_from_device_all_layer(dev, idx, idx + 16, backend)
        with pytest.raises(ValueError, match="io_backend"):
            host.load_to_device_per_layer(dev, idx, idx + 16, 0, backend)
    assert (as_bytes(host.kv_buffer) == POISON).all()


def test_bad_transfer_arguments() -> None:
    dev, host = build("mha", "layer_first", 16, torch.float16, "cpu")
    other, _ = build("mha", "layer_first", 16, torch.bfloat16, "cpu")
    poison(host.kv_buffer)
    idx = torch.arange(16)
    with pytest.raises(ValueError, match="device_pool"):
        host.backup_from_device_all_layer(other, idx, idx + 16, "kernel")
    with pytest.raises(TypeError, match="host_indices"):
        host.backup_from_device_all_layer(dev, idx.tolist(), idx + 16, "kernel")
    with pytest.raises(ValueError, match="layer_id"):
        host.load_to_device_per_layer(dev, idx, idx + 16, 3, "kernel")
    assert (as_bytes(host.kv_buffer) == POISON).all()


cuda_only = pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA")


@cuda_only
@pytest.mark.parametrize("index_device", ["cpu", "cuda"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize(("kind", "layout", "backend"), PAIRS)
def test_cuda_round_trip(
    kind: str, layout: str, backend: str, page_size: int, index_device: str
) -> None:
    round_trip(
        kind, layout, backend, page_size, torch.bfloat16, "cuda", lambda t: t.to(index_device)
    )
    torch.cuda.synchronize()


@cuda_only
def test_cuda_host_pool_is_pinned_until_closed() -> None:
    dev, host = build("mha", "layer_first", 16, torch.float16, "cuda")
    assert host.pinned and host.kv_buffer.is_pinned()
    host.close()
    assert not host.pinned and not host.kv_buffer.is_pinned()
    host.close()
    unpinned = MHATokenToKVPoolHost(dev, 2.0, 0, 16, "page_first", pin_memory=False)
    assert not unpinned.pinned and not unpinned.kv_buffer.is_pinned()


@cuda_only
def test_cuda_pin_released_on_gc() -> None:
    import gc

    _, host = build("mla", "page_first", 16, torch.float16, "cuda")
    buffer = host.kv_buffer
    assert buffer.is_pinned()
    del host
    gc.collect()
    assert not buffer.is_pinned()
