"""Sliding-window attention's plan: each request's queries over the keys their window holds."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hicache.model.batch import ForwardBatch, Segment

SlotMap = Callable[[torch.Tensor], torch.Tensor]


def window_segments(batch: ForwardBatch, window: int, to_pool: SlotMap) -> tuple[Segment, ...]:
    """``batch.segments`` cut to the keys a sliding-window layer reads, in its pool's slots.

    A query at position ``p`` sees keys ``p - window < j <= p``, so a segment of queries
    ``prefix .. seq - 1`` reads only keys ``max(0, prefix + 1 - window) .. seq - 1``: keys
    before that may have left the pool (their slots freed, or mapped to the padding slot)
    and are never gathered.

    Parameters
    ----------
    window : keys a query sees, itself included (``ModelConfig.sliding_window``).
    to_pool : maps ``[S]`` int64 full-pool slots to the int64 slots of the pool the layer
        reads (an ``SWAKVPool``'s SWA slots; the identity for a plain pool).
    """
    return tuple(_window_segment(seg, window, to_pool) for seg in batch.segments)


def _window_segment(seg: Segment, window: int, to_pool: SlotMap) -> Segment:
    n, seq = seg.end - seg.start, seg.kv_slots.numel()
    prefix = seq - n
    lo = max(0, prefix + 1 - window)
    slots = to_pool(seg.kv_slots[lo:])
    if n == 1 or (prefix == 0 and seq <= window):  # the window hides nothing causality shows
        return Segment(seg.start, seg.end, slots, None, causal=n > 1)
    device = slots.device
    keys = torch.arange(lo, seq, device=device)[None, :]
    queries = torch.arange(prefix, seq, device=device)[:, None]
    mask = (keys <= queries) & (keys > queries - window)
    return Segment(seg.start, seg.end, slots, mask)
