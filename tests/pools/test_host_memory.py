"""host_memory: chunking, threads, huge-page advice, chunked pinning and its logging (CPU with a
recording stand-in for cudaHostRegister; the real registration on CUDA)."""

from __future__ import annotations

import logging

import pytest
import torch

from hicache.pools import MHATokenToKVPoolHost, host_memory
from tests.pools.helpers import mha_pool

MIB = 1 << 20


@pytest.mark.parametrize(
    ("nbytes", "unit", "target", "expected"),
    [
        (0, 4, 8, []),
        (10, 4, 8, [(0, 8), (8, 10)]),
        (10, 4, 5, [(0, 4), (4, 8), (8, 10)]),  # the target rounds down to whole units
        (10, 16, 4, [(0, 10)]),  # at least one unit per chunk
        (12, 3, 100, [(0, 12)]),
    ],
)
def test_chunk_bounds(nbytes: int, unit: int, target: int, expected: list) -> None:
    bounds = host_memory.chunk_bounds(nbytes, unit, target)
    assert bounds == expected
    assert all(lo % unit == 0 for lo, _ in bounds)


@pytest.mark.parametrize(("nbytes", "unit", "target"), [(-1, 1, 1), (1, 0, 1), (1, 1, 0)])
def test_chunk_bounds_refuses_bad_sizes(nbytes: int, unit: int, target: int) -> None:
    with pytest.raises(ValueError, match="nbytes >= 0"):
        host_memory.chunk_bounds(nbytes, unit, target)


def test_worker_count_is_bounded() -> None:
    assert host_memory.worker_count(1) == 1
    assert 1 <= host_memory.worker_count(1000) <= host_memory.MAX_THREADS
    assert host_memory.worker_count(1000, limit=2) <= 2


def test_huge_page_advice_never_raises() -> None:
    assert host_memory.advise_huge_pages(torch.empty(16, dtype=torch.uint8)) is False  # < 2 MiB
    assert isinstance(host_memory.advise_huge_pages(torch.empty(8 * MIB, dtype=torch.uint8)), bool)


@pytest.fixture()
def registrations(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Record (call, address, bytes) instead of registering with CUDA."""
    log: list[tuple[str, int, int]] = []

    def pin(t: torch.Tensor) -> bool:
        log.append(("pin", t.data_ptr(), t.numel()))
        return True

    monkeypatch.setattr(host_memory, "pin_tensor", pin)
    monkeypatch.setattr(
        host_memory, "unpin_tensor", lambda t: log.append(("unpin", t.data_ptr(), 0))
    )
    return log


def test_pin_buffer_covers_the_buffer_in_unit_chunks(registrations, caplog) -> None:
    buf = torch.full((10 * MIB,), 7, dtype=torch.uint8)
    with caplog.at_level(logging.INFO, logger=host_memory.__name__):
        chunks, times = host_memory.pin_buffer(buf, 3 * MIB, chunk_bytes=4 * MIB, threads=2)
    spans = sorted((ptr - buf.data_ptr(), n) for _, ptr, n in registrations)
    assert spans == [(0, 3 * MIB), (3 * MIB, 3 * MIB), (6 * MIB, 3 * MIB), (9 * MIB, MIB)]
    assert len(chunks) == times.chunks == 4 and times.nbytes == 10 * MIB and times.threads == 2
    assert int(buf.max()) == 0, "touching zeroes the pages"
    assert times.seconds >= 0 and times.gbps > 0
    messages = [r.getMessage() for r in caplog.records]
    assert any("page-locking 0.01 GB in 4 chunks" in m for m in messages)
    assert any("page-locked in" in m and "GB/s" in m for m in messages)
    host_memory.unpin_chunks(chunks)
    assert [c for c, _, _ in registrations].count("unpin") == 4


def test_pin_buffer_without_touch_keeps_the_content(registrations) -> None:
    buf = torch.full((MIB,), 7, dtype=torch.uint8)
    host_memory.pin_buffer(buf, MIB, touch=False, huge_pages=False)
    assert int(buf.min()) == 7


def test_a_refused_chunk_releases_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    pinned: list[int] = []

    def pin(t: torch.Tensor) -> bool:
        if len(pinned) == 1:
            raise RuntimeError("cudaHostRegister of 1048576 bytes failed with error 2")
        pinned.append(t.data_ptr())
        return True

    monkeypatch.setattr(host_memory, "pin_tensor", pin)
    monkeypatch.setattr(host_memory, "unpin_tensor", lambda t: pinned.remove(t.data_ptr()))
    with pytest.raises(RuntimeError, match="failed with error 2"):
        host_memory.pin_buffer(
            torch.empty(2 * MIB, dtype=torch.uint8), MIB, chunk_bytes=MIB, threads=1
        )
    assert pinned == []


@pytest.mark.parametrize(
    ("layout", "unit_of"),
    [
        ("layer_first", lambda h: h.size * h.item_size),
        ("page_first_direct", lambda h: h.page_size * h.layout_dim),
    ],
)
def test_host_pool_chunks_break_between_runs(monkeypatch, registrations, layout, unit_of) -> None:
    """Chunk boundaries fall between whole layers (layer_first) or pages (page_first_direct)."""
    from hicache.pools import host_pool

    monkeypatch.setattr(host_pool, "is_cuda", lambda device: True)
    monkeypatch.setattr(host_memory, "CHUNK_BYTES", 1)
    host = MHATokenToKVPoolHost(mha_pool(), 2.0, 0, 16, layout)
    unit, base = unit_of(host), host.kv_buffer.data_ptr()
    offsets = [ptr - base for call, ptr, _ in registrations if call == "pin"]
    assert len(offsets) > 1 and all(off % unit == 0 for off in offsets)
    host.close()
    assert [c for c, _, _ in registrations].count("unpin") == len(offsets)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_chunked_registration_pins_every_chunk_on_cuda() -> None:
    buf = torch.empty(6 * MIB, dtype=torch.uint8)
    chunks, _ = host_memory.pin_buffer(buf, MIB, chunk_bytes=2 * MIB)
    try:
        assert len(chunks) == 3 and all(c.is_pinned() for c in chunks)
        src = torch.randint(0, 256, (MIB,), dtype=torch.uint8, device="cuda")
        buf[5 * MIB :].copy_(src, non_blocking=True)  # into the last chunk
        torch.cuda.synchronize()
        assert torch.equal(buf[5 * MIB :], src.cpu())
    finally:
        host_memory.unpin_chunks(chunks)
