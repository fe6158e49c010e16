"""Stream ordering and the index tensors of one issued batch (host metadata, device data)."""

from __future__ import annotations

from dataclasses import replace

import torch

from hicache.controller.operations import CacheOperation
from hicache.devices import current_stream, new_event
from hicache.pools.slot_ids import SlotIds


def wait_for_compute(stream: torch.cuda.Stream | None, device: torch.device) -> None:
    """Make transfer ``stream`` wait (GPU-side) for ``device``'s current (compute) stream; a
    no-op on CPU (``stream`` None)."""
    if stream is None:
        return
    compute = current_stream(device)
    if compute is not None:
        stream.wait_stream(compute)


def fetch_indices(op: CacheOperation, device: torch.device) -> CacheOperation:
    """``op``, or when its device indices have no CPU copy yet, ``op`` with one on the way: a
    non-blocking copy into pinned memory queued on ``device``'s current (compute) stream, which
    produced the indices, and the event after it as ``cpu_ready``. Never blocks."""
    if op.device_indices_cpu is not None:
        return op
    cpu = torch.empty(op.device_indices.shape, dtype=op.device_indices.dtype, pin_memory=True)
    cpu.copy_(op.device_indices, non_blocking=True)
    ready = new_event(device)
    ready.record(current_stream(device))
    return replace(op, device_indices_cpu=cpu, cpu_ready=ready)


def is_readable(op: CacheOperation) -> bool:
    """Whether ``op``'s CPU copy of its device indices (if any) can be read now."""
    return op.cpu_ready is None or op.cpu_ready.query()


def host_order(host_indices: torch.Tensor, page: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``host_indices`` (whole pages of ``page`` slots, on the CPU) with their pages in ascending
    host order, and the permutation of positions that does it (None: already in that order).

    Only the pages' first slots are sorted (a batch of 16k slots in pages of 64 sorts 256
    values): a page moves whole, with its slots in the order given. The order is checked in
    numpy (a batch already in order, the common case, costs no torch op).
    """
    firsts = host_indices.numpy()[::page]
    if (firsts[1:] > firsts[:-1]).all():
        return host_indices, None
    starts = host_indices[::page]
    pages = torch.argsort(starts)
    order = (pages[:, None] * page + torch.arange(page)).flatten() if page > 1 else pages
    return host_indices.index_select(0, order), order


def transfer_indices(
    op: CacheOperation,
    stream: torch.cuda.Stream | None,
    io_backend: str,
    device: torch.device,
    page: int,
    host_on_device: bool = True,
    host_ids: SlotIds | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's (host, device) index tensors as the transfer on ``stream`` needs them, built
    once per batch.

    Call inside ``stream_scope(stream)``. On CUDA the device indices are kept alive for
    ``stream`` (``record_stream``). The kernel backend gets the host indices on ``device``,
    copied once, non-blocking from pinned memory, with the pairs in host-page order
    (:func:`host_order`; ``page`` is the host pool's page size; one run of them a view of the
    host pool's ``host_ids`` kept on the device, not a copy), or on the CPU, ordered so,
    with ``host_on_device=False`` (a staged backup plans its engine copies there). The
    direct backend plans its copies on the CPU, so it gets both on the CPU: loads carry the
    allocator's CPU copy of their slots, writes the copy ``fetch_indices`` made (landed, see
    ``is_readable``); only an operation without one (an allocator lacking ``alloc_pair``)
    copies them here, blocking until ``stream`` reaches the copy.
    """
    if stream is None:
        return op.host_indices, op.device_indices
    op.device_indices.record_stream(stream)
    if io_backend == "direct":
        cpu = op.device_indices_cpu
        assert is_readable(op), "direct transfer planned before its indices reached the CPU"
        return op.host_indices, op.device_indices.cpu() if cpu is None else cpu
    # Pairs in host-address order: scattered pinned reads then stay within few host pages at
    # a time (the GPU's address translation is the bottleneck; benchmarks/RESULTS.md).
    host, order = host_order(op.host_indices, page)
    device_indices = op.device_indices
    if order is not None:
        device_indices = device_indices.index_select(
            0, order.pin_memory().to(device, non_blocking=True)
        )
    if not host_on_device:
        return host, device_indices
    if host_ids is not None:
        return host_ids.on_device(host, device), device_indices
    return host.pin_memory().to(device, non_blocking=True), device_indices
