"""Issuing one merged batch of transfers on its stream: its backend, its copies, its events.

The controller (``cache_controller.py``) owns the queues, the streams and the counters; these
functions run one batch with what it passes them and own no state.
"""

from __future__ import annotations

import torch

from hicache.controller.config import ControllerConfig, check_indices, check_node_id
from hicache.controller.integrity import PageIntegrity
from hicache.controller.layer_done import LayerDoneCounter, LayerLoadingEvent
from hicache.controller.layer_issue import LayerIssue
from hicache.controller.operations import CacheOperation, HiCacheAck
from hicache.controller.stats import TransferCounters
from hicache.controller.transfer_indices import (
    fetch_indices,
    transfer_indices,
    wait_for_compute,
)
from hicache.devices import COMPLETED, EventLike, known_host_copy, new_event, stream_scope
from hicache.pools import DevicePool, HostPool, SlotAllocator
from hicache.pools.auto_backend import resolve as resolve_backend
from hicache.pools.backup_staging import BackupStaging

_CPU = torch.device("cpu")


def batch_backend(io_backend: str, host_pool: HostPool, op: CacheOperation) -> str:
    """The concrete io_backend of batch ``op`` (``"auto"`` resolved on the CPU copy of its
    device indices when it has one; never waits)."""
    cpu = op.device_indices if op.device_indices_cpu is None else op.device_indices_cpu
    return resolve_backend(io_backend, host_pool.layout, op.host_indices, cpu, host_pool.item_size)


def write_op(
    pools: tuple[DevicePool, HostPool],
    device_indices: torch.Tensor,
    node_id: int,
    host_indices: torch.Tensor | None,
    trusted: bool = False,
) -> CacheOperation | None:
    """A backup of ``device_indices`` into ``host_indices``, or into host slots allocated here;
    None when the host pool is short (nothing allocated). Both are checked unless ``trusted``
    (the cache's own slots: a tree node's and the host pool's fresh ones)."""
    device_pool, host_pool = pools
    page = host_pool.page_size
    if not trusted:
        device = torch.device(device_pool.device)
        check_indices("device_indices", device_indices, page, device, device_pool.num_slots)
        check_node_id(node_id)
    n = device_indices.numel()
    if host_indices is None:
        host_indices = host_pool.alloc(n)
    elif not trusted:
        check_indices("host_indices", host_indices, page, _CPU, host_pool.size)
        if host_indices.numel() != n:
            raise ValueError(f"host_indices has {host_indices.numel()} slots, expected {n}")
    assert host_indices is None or host_indices.numel() == n, "trusted host_indices"
    if host_indices is None:
        return None
    # the CPU copy of the device slots when known without a device read (``to_device``'s)
    cpu = known_host_copy(device_indices)
    return CacheOperation(host_indices, device_indices, [node_id], cpu)


def load_op(
    host_pool: HostPool,
    allocator: SlotAllocator,
    io_backend: str,
    host_indices: torch.Tensor,
    node_id: int,
    trusted: bool = False,
) -> CacheOperation | None:
    """A load of ``host_indices`` (checked unless ``trusted``: a tree node's) into freshly
    allocated device slots, or None when the allocator is short. The direct backend plans on
    the CPU (and "auto" counts runs there), so those take the allocator's CPU copy of the
    slots when it offers one (``alloc_pair``)."""
    if not trusted:
        check_indices("host_indices", host_indices, host_pool.page_size, _CPU, host_pool.size)
        check_node_id(node_id)
    n = host_indices.numel()
    alloc_pair = getattr(allocator, "alloc_pair", None) if io_backend != "kernel" else None
    if alloc_pair is None:
        cpu, device_indices = None, allocator.alloc(n)
    else:
        cpu, device_indices = alloc_pair(n) or (None, None)
    if device_indices is None:
        return None
    return CacheOperation(host_indices, device_indices, [node_id], cpu)


def ready_writes(
    queue: list[CacheOperation],
    io_backend: str,
    stream: torch.cuda.Stream | None,
    device: torch.device,
) -> int:
    """How many writes at the front of ``queue`` can be issued now. Backends that plan on the
    CPU (direct; auto counts runs there) need each write's device indices there: a write
    without a CPU copy gets one started (``fetch_indices``, replaced in ``queue``) and waits,
    with the writes after it, until the copy has landed. Never blocks."""
    if io_backend != "kernel" and stream is not None:
        queue[:] = [fetch_indices(op, device) for op in queue]
    for j, op in enumerate(queue):  # ``is_readable`` inline: no call for a CPU copy at hand
        if op.cpu_ready is not None and not op.cpu_ready.query():
            return j
    return len(queue)


def wait_for_indices(queue: list[CacheOperation]) -> None:
    """Block until every queued write's CPU copy of its device indices has landed (the
    direct and auto backends stage one, ``fetch_indices``); then all of them can be issued."""
    for op in queue:
        if op.cpu_ready is not None:
            op.cpu_ready.synchronize()


def wait_for_acks(acks: tuple[HiCacheAck, ...], counters: TransferCounters) -> None:
    """Block until every ack in ``acks`` is done; a wait that blocks is counted once."""
    counters.blocking_waits += not all(ack.finish_event.query() for ack in acks)
    for ack in acks:
        ack.finish_event.synchronize()


def issue_write(
    op: CacheOperation,
    stream: torch.cuda.Stream | None,
    pools: tuple[DevicePool, HostPool],
    io_backend: str,
    counters: TransferCounters,
    integrity: PageIntegrity | None,
    staging: BackupStaging | None = None,
) -> HiCacheAck:
    """Back ``op`` up (every layer) on ``stream`` after the compute stream, a kernel batch
    through ``staging`` when its host runs suit it (``HostKVPool`` decides); its ack. On the
    CPU (``stream`` None) the copy is synchronous: no stream to enter, its events done."""
    path = (pools, io_backend, integrity, staging)
    tokens = op.host_indices.numel()
    if stream is None:
        mark = counters.d2h.begin_span()
        _backup_batch(op, None, *path)
        counters.d2h.end(mark, tokens)
        return HiCacheAck(COMPLETED, COMPLETED, op.node_ids)
    device = torch.device(pools[0].device)
    start, finish = new_event(device, timing=True), new_event(device, timing=True)
    wait_for_compute(stream, device)
    with stream_scope(stream):
        start.record(stream)
        _backup_batch(op, stream, *path)
        finish.record(stream)
    counters.d2h.end(counters.d2h.begin_span(start), tokens, finish)  # the batch's own events
    return HiCacheAck(start, finish, op.node_ids)


def _backup_batch(
    op: CacheOperation,
    stream: torch.cuda.Stream | None,
    pools: tuple[DevicePool, HostPool],
    io_backend: str,
    integrity: PageIntegrity | None,
    staging: BackupStaging | None,
) -> None:
    """``issue_write``'s copies, on the current stream (``stream``, entered)."""
    device_pool, host_pool = pools
    device = torch.device(device_pool.device)
    backend = batch_backend(io_backend, host_pool, op)
    # a kernel batch with a staging buffer keeps its host indices on the CPU: the host pool
    # decides there whether the batch suits the buffer (and moves them when it does not)
    staged = staging is not None and backend == "kernel"
    page = host_pool.page_size
    ids = getattr(host_pool, "slot_ids", None)  # ``SlotIds``: a host pool's ids on the device
    host, dev = transfer_indices(op, stream, backend, device, page, not staged, ids)
    extra = {"staging": staging} if staged else {}  # the contract's call otherwise
    host_pool.backup_from_device_all_layer(device_pool, host, dev, backend, **extra)
    if integrity is not None:
        integrity.record(op.host_indices, op.device_indices)


def claim_ring_slot(counter: LayerDoneCounter, counters: TransferCounters) -> int:
    """The counter's next ring slot for a load batch (``update_producer``), once the batch it
    still holds has landed: a blocking wait, counted, only when that batch is in flight."""

    def wait(oldest: EventLike) -> None:
        counters.blocking_waits += 1
        oldest.synchronize()

    return counter.update_producer(wait)


def issue_load(
    op: CacheOperation,
    batch: LayerLoadingEvent,
    stream: torch.cuda.Stream | None,
    pools: tuple[DevicePool, HostPool],
    config: ControllerConfig,
    counters: TransferCounters,
) -> LayerIssue:
    """Load ``op`` on ``stream`` layer by layer, recording ``batch``'s event after each layer
    (planned once for every layer of the batch). Every layer is issued here when
    ``config.layers_ahead`` is None, else that many and the rest deferred to ``batch``
    (``LayerLoadingEvent.defer``). Returns the batch's issue (``done`` when whole)."""
    device_pool, host_pool = pools
    device = torch.device(device_pool.device)
    finish = batch.finish_event
    with stream_scope(stream):
        batch.start_event.record(stream)
        mark = counters.h2d.begin(batch.start_event)
        backend = batch_backend(config.io_backend, host_pool, op)
        ids = getattr(host_pool, "slot_ids", None)
        host, dev = transfer_indices(op, stream, backend, device, host_pool.page_size, True, ids)
        plan = host_pool.plan_load(device_pool, host, dev, backend)

    def on_done() -> None:
        finish.record(stream)
        counters.h2d.end(mark, len(op), finish)

    layers = plan.num_layers  # a composite pool's: every global layer, linear ones too
    ahead = layers if config.layers_ahead is None else config.layers_ahead
    issue = LayerIssue(plan, layers, stream, batch.complete, on_done, ahead, mark)
    issue.through(ahead - 1)
    if not issue.done:
        batch.defer(issue)
    return issue
