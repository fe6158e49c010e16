"""Small host -> device uploads (index tensors, table rows) through one reused pinned buffer.

A non-blocking copy needs page-locked source memory; ``tensor.pin_memory()`` takes a block from
torch's caching host allocator on every call (~10 us of CPU on the H100 host, several times a
scheduler step). A :class:`PinnedRing` hands out consecutive 16-byte-aligned pieces of one
pinned buffer instead (a slice and a copy). The buffer is cut into segments. Leaving a segment
records an event on every stream that copied from it, and a segment is entered again only once
its events have completed: queried, never waited for. Until then, and for a tensor larger than
a segment, :meth:`PinnedRing.upload` returns None and the caller pins as before. So no piece is
written again before the GPU has read it, and nothing waits. Nothing here imports from the rest
of the package (:mod:`hicache.devices` owns one ring per CUDA device).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

import torch

ALIGN = 16  # bytes: each piece starts on a 16-byte boundary (any dtype's view is aligned)


class Query(Protocol):
    def query(self) -> bool: ...


class PinnedRing:
    """``segments`` segments of ``buffer`` (1-D uint8, pinned on CUDA) handed out in order.

    ``record(stream)`` returns an event recorded on ``stream`` (an int key the caller gives
    with each upload: CUDA's raw stream handle); it runs only when a segment is left.
    """

    def __init__(self, buffer: torch.Tensor, segments: int, record: Callable[[int], Query]) -> None:
        if buffer.dtype != torch.uint8 or buffer.dim() != 1:
            raise TypeError("buffer must be a 1-D uint8 tensor")
        if segments < 2 or buffer.numel() % (segments * ALIGN):
            raise ValueError(f"buffer of {buffer.numel()} bytes does not split into {segments}")
        self.segment_bytes = buffer.numel() // segments
        self._buffer, self._segments, self._record = buffer, segments, record
        self._segment, self._pos = 0, 0  # the current segment, the next free byte in it
        self._streams: set[int] = set()  # the streams that copied from the current segment
        self._guards: list[list[Query]] = [[] for _ in range(segments)]
        self._lock = threading.Lock()
        self.fallbacks = 0  # uploads refused while the next segment was still being read

    def upload(self, host: torch.Tensor, device: torch.device, stream: int) -> torch.Tensor | None:
        """``host`` (contiguous, on the CPU) copied to ``device`` without blocking, from a piece
        of the ring, on the current stream (whose key is ``stream``); None when ``host`` does
        not fit a segment or the next segment is still being read (then nothing changed)."""
        nbytes = host.numel() * host.element_size()
        if not 0 < nbytes <= self.segment_bytes or not host.is_contiguous():
            return None
        with self._lock:
            start = -(-self._pos // ALIGN) * ALIGN
            if start + nbytes > self.segment_bytes:
                if not self._advance():
                    self.fallbacks += 1
                    return None
                start = 0
            at = self._segment * self.segment_bytes + start
            piece = self._buffer[at : at + nbytes].view(host.dtype).view(host.shape)
            piece.copy_(host)
            out = piece.to(device, non_blocking=True)
            self._pos = start + nbytes
            self._streams.add(stream)
        return out

    def _advance(self) -> bool:
        """Move to the next segment if every copy from it has run; guard the one left."""
        following = (self._segment + 1) % self._segments
        if not all(event.query() for event in self._guards[following]):
            return False
        self._guards[self._segment] = [self._record(s) for s in self._streams]
        self._guards[following] = []
        self._segment, self._pos, self._streams = following, 0, set()
        return True
