"""HiCacheController: moves KV between the device pool (L1) and the host pool (L2).

Writes (device -> host backups of all layers) and loads (host -> device, layer by layer) are
queued by ``write``/``load``, which only allocate the destination slots, and issued in merged
batches by ``start_writing``/``start_loading`` on dedicated CUDA streams. Completion is reported
through :class:`~hicache.controller.operations.HiCacheAck`s; per-layer completion of a load batch
through the :class:`~hicache.controller.layer_done.LayerDoneCounter` registered on the device pool.

Stream protocol (CUDA): the stream that is current when ``start_writing``/``start_loading`` is
called is the compute stream. Both transfer streams first wait for it (GPU-side), so a backup
copies KV only after the kernels that produced it, and a load overwrites reused device slots only
after the kernels queued before it that still read them. The forward pass then waits per layer
via ``LayerDoneCounter.wait_until``. On CPU the streams are ``None``, events are completed no-ops
and every transfer is synchronous: the same code path, so CPU tests exercise all the logic.
Not thread-safe: one scheduler thread drives a controller.
"""

from __future__ import annotations

import torch

from hicache.controller import issue
from hicache.controller.config import (
    ControllerConfig,
    SetLike,
    check_host_pool,
    check_load_cache_event,
    check_pools,
)
from hicache.controller.integrity import PageIntegrity
from hicache.controller.layer_done import LayerDoneCounter
from hicache.controller.layer_issue import LayerIssue
from hicache.controller.operations import CacheOperation, HiCacheAck
from hicache.controller.stats import TransferCounters, TransferStats
from hicache.controller.transfer_indices import wait_for_compute
from hicache.devices import new_stream, stream_scope
from hicache.pools import HostPool, KVPool, SlotAllocator
from hicache.pools.backup_staging import controller_staging


class HiCacheController:
    """Queue and issue KV transfers between a device KV pool and its host KV pool.

    Parameters
    ----------
    token_to_kv_pool_allocator : ``TokenToKVPoolAllocator`` (or ``SWATokenToKVPoolAllocator``)
        of the device pool; its ``get_kvcache()`` is the device pool (``mem_pool_device``).
    mem_pool_host : ``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost`` built on that device pool;
        a ``HybridKVPoolHost`` on a composite one.
    page_size : slots per page; must equal the allocator's and the host pool's.
    load_cache_event : an optional ``threading.Event`` (any ``set()``), set per issued load batch.
    write_policy, io_backend, layers_ahead : see :class:`ControllerConfig` (``io_backend``
        ``"auto"`` by default; the radix cache acts on ``write_policy``; how the direct ops
        avoid a sync: ``issue.load_op``, :meth:`start_writing`).
    verify, verify_sample_period : page integrity (``"off"``, ``"sample"``, ``"all"``; see
        :mod:`hicache.controller.integrity`): backups record checksums, ``verify_load`` checks.

    Attributes
    ----------
    mem_pool_device, mem_pool_host, geometry : the two KV pools; the device pool's geometry
        (None for a composite pool: each inner pool has its own).
    layer_done_counter : :class:`LayerDoneCounter` over ``mem_pool_host.layer_num``, registered
        on the device pool (``get_*_buffer(l)`` waits for layer ``l`` of the consumer batch).
    write_queue, load_queue : ``list[CacheOperation]`` queued but not yet issued.
    ack_write_queue, ack_load_queue : ``list[HiCacheAck]`` of issued batches in issue order; the
        radix cache pops them (see ``operations.pop_finished_acks``) once ``finish_event`` is done.
    write_stream, load_stream : dedicated CUDA streams, ``None`` on CPU; the load stream at the
        device's highest priority (a forward pass waits on it), the write stream the lowest.
    integrity : the :class:`PageIntegrity` checksum store, or None when ``verify="off"``.
    staging : the write stream's ``BackupStaging`` (kernel backups through the copy engines),
        or None (CPU, direct, ``HICACHE_BACKUP_STAGING_MB=0``, a ``HybridKVPoolHost``).
    counters : the :class:`~hicache.controller.stats.TransferCounters` (:meth:`stats`).

    Raises ``ValueError`` / ``TypeError`` on bad settings (``ControllerConfig``), a ``page_size``
    or host pool geometry (named) not the device pool's, no device pool, a bad ``load_cache_event``.
    """

    def __init__(
        self,
        token_to_kv_pool_allocator: SlotAllocator,
        mem_pool_host: HostPool,
        page_size: int,
        load_cache_event: SetLike | None = None,
        write_policy: str = "write_through",
        io_backend: str = "auto",
        verify: str = "off",
        verify_sample_period: int = 8,
        layers_ahead: int | None = None,
    ) -> None:
        check_host_pool(mem_pool_host)
        self.config = ControllerConfig(
            page_size, write_policy, io_backend, mem_pool_host.layout, layers_ahead
        )
        device_pool = check_pools(token_to_kv_pool_allocator, mem_pool_host, page_size)
        check_load_cache_event(load_cache_event)
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.load_cache_event = load_cache_event
        self.integrity = PageIntegrity.build(
            device_pool, mem_pool_host, verify, verify_sample_period
        )
        self.mem_pool_device, self.mem_pool_host = device_pool, mem_pool_host
        self.geometry = device_pool.geometry if isinstance(device_pool, KVPool) else None
        self.device, self.layer_num = device_pool.device, mem_pool_host.layer_num
        self.write_stream = new_stream(self.device)
        self.staging = controller_staging(mem_pool_host, io_backend)  # used on write_stream only
        self.load_stream = new_stream(self.device, urgent=True)  # a forward pass waits on it
        self.layer_done_counter = LayerDoneCounter(self.layer_num, self.device)
        device_pool.register_layer_transfer_counter(self.layer_done_counter)
        self.write_queue: list[CacheOperation] = []
        self.load_queue: list[CacheOperation] = []
        self.ack_write_queue: list[HiCacheAck] = []
        self.ack_load_queue: list[HiCacheAck] = []
        self.counters = TransferCounters(self.device, mem_pool_host)
        self._pending: LayerIssue | None = None  # the last load batch, while not fully issued

    @property
    def page_size(self) -> int:
        return self.config.page_size

    @property
    def write_policy(self) -> str:
        return self.config.write_policy

    @property
    def io_backend(self) -> str:
        return self.config.io_backend

    def issue_pending(self) -> None:
        """Issue the layers of the last load batch that ``layers_ahead`` left for the forward
        pass (a no-op when none are left). Every other transfer call does this first."""
        if self._pending is not None:
            self._pending.finish()
            self._pending = None

    def write(
        self,
        device_indices: torch.Tensor,
        node_id: int,
        host_indices: torch.Tensor | None = None,
        *,
        trusted: bool = False,
    ) -> torch.Tensor | None:
        """Allocate host slots for ``device_indices`` and queue their backup (all layers).

        Parameters
        ----------
        device_indices : int64 ``[n]`` device slots on the device pool's device, ``n`` a
            positive multiple of ``page_size``. They must stay allocated (the node locked) until
            the batch's ack has completed.
        node_id : id of the radix node the slots belong to; reported in the ack.
        host_indices : int64 ``[n]`` CPU host slots the caller already took from
            ``mem_pool_host`` (``alloc``) to write into, or None to allocate them here.
        trusted : the cache's own call with slots it made (a tree node's, the host pool's
            fresh ones): the argument checks are skipped. Every other caller leaves it False.

        Returns
        -------
        int64 ``[n]`` CPU host slots now owned by the caller, or ``None`` when the host pool is
        short (nothing allocated, nothing queued). The copy happens at :meth:`start_writing`.
        """
        pools = (self.mem_pool_device, self.mem_pool_host)
        op = issue.write_op(pools, device_indices, node_id, host_indices, trusted)
        if op is None:
            return None
        self.write_queue.append(op)
        return op.host_indices

    def load(
        self, host_indices: torch.Tensor, node_id: int, *, trusted: bool = False
    ) -> torch.Tensor | None:
        """Allocate device slots for ``host_indices`` and queue their load (layer by layer).

        Parameters
        ----------
        host_indices : int64 ``[n]`` CPU host slots, ``n`` a positive multiple of ``page_size``.
        node_id : id of the radix node the slots belong to; reported in the ack.
        trusted : as :meth:`write`'s (``host_indices`` a tree node's).

        Returns
        -------
        int64 ``[n]`` device slots (allocator's device) now owned by the caller, or ``None`` when
        the allocator is short (nothing allocated, nothing queued). Their content is valid for a
        forward pass that waits on the producer index :meth:`start_loading` returns.
        """
        allocator, backend = self.token_to_kv_pool_allocator, self.config.io_backend
        op = issue.load_op(self.mem_pool_host, allocator, backend, host_indices, node_id, trusted)
        if op is None:
            return None
        self.load_queue.append(op)
        return op.device_indices

    def unqueue_load(self, node_id: int) -> None:
        """Take back the load :meth:`load` queued last, ``node_id``'s (else ``ValueError``, no
        change), before it is issued: its device slots go back to the allocator."""
        if not self.load_queue or self.load_queue[-1].node_ids != [node_id]:
            raise ValueError(f"unqueue_load: the last queued load is not node {node_id}'s")
        self.evict_device(self.load_queue.pop().device_indices)

    def start_writing(self) -> None:
        """Issue the queued writes as one batch on the write stream; append its ack.

        The write stream first waits (GPU-side) for the current compute stream, so the backup
        sees the KV written by kernels queued before this call. Returns at once when the write
        queue is empty. On error the queue is left as it was. Never blocks: with the direct or
        auto backend on CUDA a write whose device indices are not yet on the CPU starts their
        asynchronous copy and stays queued, with the writes after it, until a later call finds
        the copy landed (``drain`` waits for it).
        """
        if self._pending is not None:  # ``issue_pending``, without a call when idle
            self.issue_pending()
        if not self.write_queue:
            return
        backend = self.config.io_backend
        ready = issue.ready_writes(self.write_queue, backend, self.write_stream, self.device)
        if ready:
            op = CacheOperation.merge(self.write_queue[:ready])  # a lone write as it is
            pools = (self.mem_pool_device, self.mem_pool_host)
            path = (self.write_stream, pools, backend, self.counters, self.integrity)
            self.ack_write_queue.append(issue.issue_write(op, *path, self.staging))
            del self.write_queue[:ready]

    def start_loading(self) -> int:
        """Issue every queued load as one batch on the load stream, layer by layer.

        The load stream first waits (GPU-side) for the current compute stream. Layer ``l`` is
        copied, then the batch's event for ``l`` is recorded, so a forward pass that called
        ``layer_done_counter.set_consumer(index)`` can start layer ``l`` while later layers load.
        Blocks the CPU only when every ring slot still holds a batch in flight (it waits for the
        oldest). On error the queue is left as it was.

        Returns the batch's producer index (ring slot) for ``set_consumer``; -1: none queued."""
        if self._pending is not None:  # (``issue_pending``, inline on the per-step path)
            self.issue_pending()
        if not self.load_queue:
            return -1
        op = CacheOperation.merge(self.load_queue)  # a lone load as it is
        wait_for_compute(self.load_stream, self.device)
        producer = issue.claim_ring_slot(self.layer_done_counter, self.counters)
        pools = (self.mem_pool_device, self.mem_pool_host)
        batch = self.layer_done_counter.events[producer]
        layers = issue.issue_load(op, batch, self.load_stream, pools, self.config, self.counters)
        self._pending = None if layers.done else layers
        self.load_queue.clear()
        self.ack_load_queue.append(HiCacheAck(batch.start_event, batch.finish_event, op.node_ids))
        if self.load_cache_event is not None:
            self.load_cache_event.set()
        return producer

    def verify_load(self, host_indices: torch.Tensor, device_indices: torch.Tensor) -> int | None:
        """``PageIntegrity.first_mismatch`` of the issued loads, on the load stream after all
        issued there; blocks until the result is read."""
        assert self.integrity is not None, "verify_load needs verify='sample' or 'all'"
        self.issue_pending()
        with stream_scope(self.load_stream):
            return self.integrity.first_mismatch(host_indices, device_indices)

    def drain(self) -> None:
        """Issue the queued writes, then block until every issued write and load has landed.
        Queued loads are not issued (their producer index belongs to a forward pass that
        ``start_loading`` serves). Afterwards every ack in ``ack_write_queue`` and
        ``ack_load_queue`` is done, so ``pop_finished_acks`` pops them all. A no-op wait on CPU."""
        self.start_writing()
        issue.wait_for_indices(self.write_queue)  # writes whose indices are on their way
        self.start_writing()
        issue.wait_for_acks((*self.ack_write_queue, *self.ack_load_queue), self.counters)

    def evict_device(self, device_indices: torch.Tensor) -> int:
        """Free device slots through the allocator; returns how many were given. The slots must
        not belong to a batch whose ack has not completed. Raises whatever the allocator raises
        on slots that are not allocated (state unchanged)."""
        self.token_to_kv_pool_allocator.free(device_indices)
        return device_indices.numel()

    def evict_host(self, host_indices: torch.Tensor) -> int:
        """Free host slots; returns how many were freed. Same rules as :meth:`evict_device`."""
        return self.mem_pool_host.free(host_indices)

    def reset(self) -> None:
        """Wait for in-flight transfers, then drop queued operations, acks and counter state.
        Safe with transfers in flight: both streams are synchronized first, so no copy can land
        after the caller reuses the slots. Slots held by queued or acked operations are NOT
        freed here: they belong to the radix cache, whose ``reset()`` clears both pools."""
        self.issue_pending()
        for stream in (self.write_stream, self.load_stream):
            if stream is not None:
                stream.synchronize()
        self.write_queue.clear()
        self.load_queue.clear()
        self.ack_write_queue.clear()
        self.ack_load_queue.clear()
        self.layer_done_counter.reset()

    def stats(self) -> TransferStats:
        """A snapshot of the transfer counters (never blocks; see ``controller.stats``)."""
        return self.counters.snapshot(
            (self.load_queue, self.write_queue),
            (self.ack_load_queue, self.ack_write_queue),
            self.layer_done_counter.waits,
            0 if self.integrity is None else self.integrity.failures,
        )
