"""The pinned ring of small host -> device uploads: pieces handed out in order, aligned and
apart; a segment entered again only once the copies from it have run (never waited for); what
does not fit is refused with nothing changed; on CUDA every upload lands byte-exact."""

from __future__ import annotations

import pytest
import torch

from hicache import devices
from hicache.uploads import ALIGN, PinnedRing


class FakeEvent:
    def __init__(self, stream: int) -> None:
        self.stream, self.done = stream, False

    def query(self) -> bool:
        return self.done


def _ring(nbytes: int = 256, segments: int = 4) -> tuple[PinnedRing, list[FakeEvent], torch.Tensor]:
    recorded: list[FakeEvent] = []

    def record(stream: int) -> FakeEvent:
        recorded.append(FakeEvent(stream))
        return recorded[-1]

    buffer = torch.zeros(nbytes, dtype=torch.uint8)
    return PinnedRing(buffer, segments, record), recorded, buffer


def _values(n: int, seed: int) -> torch.Tensor:
    return torch.randint(-(2**40), 2**40, (n,), generator=torch.Generator().manual_seed(seed))


def test_pieces_are_aligned_apart_and_hold_the_values() -> None:
    ring, recorded, buffer = _ring()
    base = buffer.data_ptr()
    spans = []
    for seed, n in enumerate((3, 1, 2)):  # 24 + 8 + 16 bytes: all in segment 0 (64 bytes)
        host = _values(n, seed)
        out = ring.upload(host, torch.device("cpu"), stream=7)
        assert out is not None and torch.equal(out, host)
        start = out.data_ptr() - base
        assert start % ALIGN == 0
        spans.append((start, start + 8 * n))
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert spans[-1][1] <= ring.segment_bytes and not recorded  # nothing left yet


def test_a_segment_is_reentered_only_after_its_copies_ran() -> None:
    ring, recorded, buffer = _ring()
    cpu = torch.device("cpu")
    first = ring.upload(_values(8, 1), cpu, stream=1)  # fills segment 0 (64 bytes)
    assert first is not None and first.data_ptr() == buffer.data_ptr()
    for segment in (1, 2, 3):
        out = ring.upload(_values(8, segment), cpu, stream=segment + 1)
        assert out is not None
        assert out.data_ptr() - buffer.data_ptr() == segment * ring.segment_bytes
    assert [e.stream for e in recorded] == [1, 2, 3]  # each segment left, guarded by its stream
    held = buffer.clone()
    assert ring.upload(_values(8, 9), cpu, stream=5) is None  # segment 0 still being read
    assert ring.fallbacks == 1 and torch.equal(buffer, held) and len(recorded) == 3
    recorded[0].done = True
    again = ring.upload(_values(8, 9), cpu, stream=5)
    assert again is not None and again.data_ptr() == buffer.data_ptr()
    assert torch.equal(again, _values(8, 9)) and [e.stream for e in recorded] == [1, 2, 3, 4]


def test_what_does_not_fit_is_refused() -> None:
    ring, recorded, buffer = _ring()
    cpu = torch.device("cpu")
    assert ring.upload(_values(9, 0), cpu, stream=0) is None  # 72 bytes > a 64-byte segment
    assert ring.upload(torch.empty(0, dtype=torch.int64), cpu, stream=0) is None
    assert ring.upload(_values(8, 0)[::2], cpu, stream=0) is None  # not contiguous
    assert ring.fallbacks == 0 and not recorded and not buffer.any()
    with pytest.raises(TypeError, match="buffer"):
        PinnedRing(torch.zeros(64, dtype=torch.int32), 2, FakeEvent)
    with pytest.raises(ValueError, match="3"):
        PinnedRing(torch.zeros(64, dtype=torch.uint8), 3, FakeEvent)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_uploads_land_exactly_while_the_stream_is_held_back() -> None:
    """Hundreds of uploads of random sizes queued behind a long kernel wrap a small ring many
    times over: no piece is reused before its copy ran (refused, pinned instead), and every
    result equals its source."""
    device = torch.device("cuda", torch.cuda.current_device())
    buffer = torch.empty(4096, dtype=torch.uint8, pin_memory=True)
    ring = PinnedRing(buffer, 4, lambda raw: _cuda_event(raw, device))
    gen = torch.Generator().manual_seed(0)
    sources, outs = [], []
    torch.cuda._sleep(100_000_000)
    for i in range(300):
        n = int(torch.randint(1, 160, (1,), generator=gen))
        host = torch.randint(0, 2**62, (n,), generator=gen, dtype=torch.int64)
        out = ring.upload(host, device, devices.raw_stream(device.index))
        outs.append(out if out is not None else host.pin_memory().to(device, non_blocking=True))
        sources.append(host)
        if i % 50 == 0:
            devices.to_device(host.clone(), device)  # the devices' own ring, same stream
    torch.cuda.synchronize()
    assert ring.fallbacks > 0
    assert all(torch.equal(o.cpu(), s) for o, s in zip(outs, sources, strict=True))


def _cuda_event(raw: int, device: torch.device) -> torch.cuda.Event:
    event = torch.cuda.Event()
    event.record(torch.cuda.ExternalStream(raw, device=device))
    return event


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_to_device_carries_its_host_copy_and_lands() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    hosts = [_values(n, n) for n in (1, 100, 5000, 300_000)]  # the last: larger than a segment
    outs = [devices.to_device(h, device) for h in hosts]
    torch.cuda.synchronize()
    for host, out in zip(hosts, outs, strict=True):
        assert out.device == device and torch.equal(out.cpu(), host)
        assert devices.known_host_copy(out) is host
