"""Queued transfers and their acknowledgements.

A :class:`CacheOperation` is one node's worth of KV to copy between the tiers; queued operations
are merged into one batch per ``start_writing``/``start_loading`` call so the per-layer kernels are
launched once per batch, not once per node. A :class:`HiCacheAck` reports a batch back to the radix
cache: once ``finish_event`` has completed, every node in ``node_ids`` may be unlocked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from hicache.devices import EventLike


@dataclass(frozen=True)
class CacheOperation:
    """Copy the KV of ``node_ids`` between ``host_indices`` and ``device_indices``.

    Attributes
    ----------
    host_indices : int64 ``[n]`` slots of the host pool (CPU).
    device_indices : int64 ``[n]`` slots of the device pool (on the device pool's device).
        Token ``i`` of the operation lives at ``host_indices[i]`` and ``device_indices[i]``
        (the same ``n``: ``write_op``/``load_op`` check or make them so; no check here, on
        every queued transfer).
    node_ids : ids of the radix nodes the slots belong to, in queueing order.
    device_indices_cpu : ``device_indices`` on the CPU when the queuer had them there (loads:
        the allocator's own copy), so a transfer planned on the CPU needs no device sync.
    cpu_ready : None when ``device_indices_cpu`` (if any) can be read now; else the event
        recorded after the asynchronous copy that fills it (a direct write's indices on their
        way from the device): readable once the event has completed.
    """

    host_indices: torch.Tensor
    device_indices: torch.Tensor
    node_ids: list[int]
    device_indices_cpu: torch.Tensor | None = None
    cpu_ready: EventLike | None = None

    def __len__(self) -> int:
        return self.host_indices.numel()

    @classmethod
    def merge(cls, ops: Sequence[CacheOperation]) -> CacheOperation:
        """One operation covering ``ops`` in order (indices concatenated, node ids joined).

        A single operation is returned as is; the inputs are never modified. Every CPU copy
        must be readable (``cpu_ready`` None or completed).
        """
        assert ops, "CacheOperation.merge: nothing to merge"
        if len(ops) == 1:
            return ops[0]
        cpu = [op.device_indices_cpu for op in ops if op.device_indices_cpu is not None]
        return cls(
            host_indices=torch.cat([op.host_indices for op in ops]),
            device_indices=torch.cat([op.device_indices for op in ops]),
            node_ids=[node_id for op in ops for node_id in op.node_ids],
            device_indices_cpu=torch.cat(cpu) if len(cpu) == len(ops) else None,
        )


class HiCacheAck(NamedTuple):
    """A batch of transfers issued on a transfer stream.

    Attributes
    ----------
    start_event : recorded on the transfer stream before the batch's first copy.
    finish_event : recorded after its last copy; ``finish_event.query()`` is True once every byte
        has landed (always True on CPU).
    node_ids : the radix nodes whose KV the batch carries, in queueing order.
    """

    start_event: EventLike
    finish_event: EventLike
    node_ids: list[int]


def pop_finished_acks(queue: list[HiCacheAck]) -> list[HiCacheAck]:
    """Remove and return the acks at the front of ``queue`` whose ``finish_event`` has completed.

    Batches on one stream finish in issue order, so this stops at the first unfinished ack.
    Never blocks (``query()``, not ``synchronize()``).
    """
    done = 0
    while done < len(queue) and queue[done].finish_event.query():
        done += 1
    finished = queue[:done]
    del queue[:done]
    return finished
