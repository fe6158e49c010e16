"""HybridKVPoolHost: the host pool (L2) of a composite device pool (a hybrid model's KV).

SGLang's host pool group, for ``SWAKVPool`` and ``HybridLinearKVPool``: one host pool per inner
device pool (``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost``), the full-attention one first,
all of ONE size. The full one's allocator hands out the host slots of all: host slot ``h`` holds
one token's KV in every attention layer, each inner pool's share in its own buffer. A backup or
a load names allocator (full-pool) slots; the composite pool maps them to each inner pool's
(``CompositeKVPool.inner_slots``: SWA slots through ``full_to_swa_index_mapping``) when the batch
is issued, on the stream it runs on. A token whose SWA slot was freed (tombstoned) maps to 0,
the padding slot: its backup reads, and its load writes, that slot only; the tree marks such
host KV as outside every window and never serves it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from hicache.pools.backup_staging import BackupStaging
from hicache.pools.composite_pool import CompositeKVPool
from hicache.pools.device_pool import KVPool
from hicache.pools.host_layouts import check_ram, host_slots
from hicache.pools.host_pool import HostKVPool
from hicache.pools.load_plan import LoadPlan
from hicache.pools.mha_pool import MHATokenToKVPool, MHATokenToKVPoolHost
from hicache.pools.mla_pool import MLATokenToKVPool, MLATokenToKVPoolHost


def host_pool_class(device_pool: object, name: str = "device_pool") -> type[HostKVPool]:
    """The host pool class of a plain device pool: MLA's for an ``MLATokenToKVPool``, MHA's for
    an ``MHATokenToKVPool``; ``TypeError`` naming ``name`` for anything else."""
    if isinstance(device_pool, MLATokenToKVPool):
        return MLATokenToKVPoolHost
    if isinstance(device_pool, MHATokenToKVPool):
        return MHATokenToKVPoolHost
    raise TypeError(
        f"{name} must be an MHATokenToKVPool or MLATokenToKVPool, got {type(device_pool).__name__}"
    )


@dataclass(frozen=True)
class HybridLoadPlan:
    """One validated load batch of a composite pool, every layer: one ``LoadPlan`` per inner
    pool, routed by layer.

    ``run(l)`` copies transfer layer ``l`` (global layer ``start_layer + l``; the global id
    itself when ``start_layer`` is 0): an attention layer from its inner host pool, a layer
    without KV (a linear one) nothing. ``TypeError``/``ValueError`` for ``l`` outside
    ``[0, num_layers)``; ``RuntimeError`` once the host pool is closed.
    """

    plans: tuple[LoadPlan, ...]  # in CompositeKVPool.inner_pools order
    routes: dict[int, tuple[int, int]]  # transfer layer -> (plan, the inner pool's layer)
    num_layers: int

    def run(self, layer_id: int) -> None:
        if isinstance(layer_id, bool) or not isinstance(layer_id, int):
            raise TypeError(f"layer_id must be an int, got {type(layer_id).__name__}")
        if not 0 <= layer_id < self.num_layers:
            raise ValueError(f"layer_id must be in [0, {self.num_layers}), got {layer_id}")
        if layer_id in self.routes:
            plan, inner = self.routes[layer_id]
            self.plans[plan].run(inner)
        elif self.plans[0].host_pool.closed:
            raise RuntimeError("this host pool is closed")


class HybridKVPoolHost:
    """Host pool of a ``SWAKVPool`` or ``HybridLinearKVPool``: one inner host pool per inner
    device pool, all with the same host slots.

    Parameters
    ----------
    device_pool : the composite device pool (its inner pools MHA or MLA).
    host_to_device_ratio : host slots = ratio * the full-attention pool's ``size``, used when
        ``host_size_gb <= 0``.
    host_size_gb : GB (1e9 bytes) of all inner host pools together (over ``slot_bytes``) when > 0.
    page_size, layout, pin_memory, io_backend : each inner pool's (``HostKVPool``).

    Attributes
    ----------
    host_pools : the inner host pools, in ``device_pool.inner_pools`` order (the full one first).
    size, page_size, layout, pinned : shared by every inner pool.
    item_size : the full pool's bytes of one slot in one layer of one part.
    slot_bytes : bytes of one host slot, summed over the inner pools.
    layer_num : ``device_pool.transfer_layer_num``: layers a load plan runs.

    Raises ``TypeError`` for a device pool that is no composite pool of MHA/MLA pools, and what
    ``HostKVPool`` raises (bad layout or pair, no page, RAM short for all of them) before
    allocating. Backup staging (``staging``) is not supported: ``ValueError``.
    """

    def __init__(
        self,
        device_pool: CompositeKVPool,
        host_to_device_ratio: float,
        host_size_gb: float,
        page_size: int,
        layout: str,
        pin_memory: bool = True,
        *,
        io_backend: str | None = None,
    ) -> None:
        if not isinstance(device_pool, CompositeKVPool):
            raise TypeError(
                f"device_pool must be a SWAKVPool or HybridLinearKVPool, "
                f"got {type(device_pool).__name__}"
            )
        if page_size != device_pool.page_size:
            raise ValueError(f"page_size must equal device_pool.page_size={device_pool.page_size}")
        inner = device_pool.inner_pools
        classes = [host_pool_class(pool, "an inner pool of device_pool") for pool in inner]
        self.slot_bytes = sum(map(_slot_bytes, inner))
        size = device_pool.size
        slots = host_slots(size, host_to_device_ratio, host_size_gb, page_size, self.slot_bytes)
        check_ram(slots * self.slot_bytes)
        self.device_pool = device_pool
        self.host_pools = [
            cls(pool, 0.0, 0.0, page_size, layout, pin_memory, io_backend=io_backend, slots=slots)
            for cls, pool in zip(classes, inner, strict=True)
        ]
        full = self.host_pools[0]
        self.size, self.page_size, self.layout = full.size, full.page_size, full.layout
        self.item_size, self.pinned = full.item_size, full.pinned
        self.layer_num = device_pool.transfer_layer_num

    @property
    def closed(self) -> bool:
        return self.host_pools[0].closed

    # -- slot accounting: the full pool's allocator, for every inner pool ------------------------

    def alloc(self, n: int) -> torch.Tensor | None:
        """``n`` host slots (int64, CPU, whole pages; ``n`` a page multiple) or None when short."""
        return self.host_pools[0].alloc(n)

    def free(self, indices: torch.Tensor) -> int:
        """Free the pages holding ``indices``; returns the number of slots freed."""
        return self.host_pools[0].free(indices)

    def available_size(self) -> int:
        return self.host_pools[0].available_size()

    def clear(self) -> None:
        self.host_pools[0].clear()

    def free_slots(self) -> torch.Tensor:
        """Every free host slot, sorted int64 CPU."""
        return self.host_pools[0].free_slots()

    def check_invariants(self) -> None:
        """The allocator's invariants; ``RuntimeError`` when another inner pool has a slot
        allocated (their allocators are never used)."""
        self.host_pools[0].check_invariants()
        for pool in self.host_pools[1:]:
            if pool.available_size() != pool.size:
                raise RuntimeError("hybrid host pool: an inner pool's own allocator was used")

    def close(self) -> None:
        """Close every inner pool (idempotent); later transfers raise ``RuntimeError``."""
        for pool in self.host_pools:
            pool.close()
        self.pinned = False

    # -- transfers ------------------------------------------------------------------------------

    def backup_from_device_all_layer(
        self,
        device_pool: CompositeKVPool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
        staging: BackupStaging | None = None,
    ) -> None:
        """Copy every attention layer of allocator slots ``device_indices`` to host slots
        ``host_indices``: each inner pool's slots of them (``inner_slots``, translated here, on
        the current stream) into its inner host pool. ``staging`` must be None."""
        if staging is not None:
            raise ValueError("staging: a hybrid host pool's backups are not staged; pass None")
        for host, dev, slots in self._routes(device_pool, device_indices):
            host.backup_from_device_all_layer(dev, host_indices, slots, io_backend)

    def plan_load(
        self,
        device_pool: CompositeKVPool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
    ) -> HybridLoadPlan:
        """Validate and plan, once, the load of every layer of ``host_indices`` to allocator
        slots ``device_indices`` (each inner pool's slots of them translated now, on the current
        stream: plan on the stream the layers run on)."""
        plans = tuple(
            host.plan_load(dev, host_indices, slots, io_backend)
            for host, dev, slots in self._routes(device_pool, device_indices)
        )
        start, mapping = device_pool.start_layer, device_pool.layers_mapping
        routes = {g - start: (int(is_swa), i) for g, (i, is_swa) in mapping.items()}
        return HybridLoadPlan(plans, routes, self.layer_num)

    def _routes(
        self, device_pool: Any, device_indices: torch.Tensor
    ) -> Iterator[tuple[HostKVPool, KVPool, torch.Tensor]]:
        """``(inner host pool, inner device pool, its slots of device_indices)`` each, after
        checking ``device_pool`` (every other check is the inner pools')."""
        differences = self.mismatch(device_pool)
        if differences:
            raise ValueError(
                "device_pool does not match the pool this host pool was built for: "
                + "; ".join(differences)
            )
        slots = device_pool.inner_slots(device_indices)
        return zip(self.host_pools, device_pool.inner_pools, slots, strict=True)

    def mismatch(self, device_pool: Any) -> list[str]:
        """How ``device_pool`` differs from the pool this host pool was built for (a query):
        its type and layers, then each inner pool's ``PageGeometry.mismatch`` entries."""
        mine = self.device_pool
        if device_pool is mine:
            return []
        if type(device_pool) is not type(mine):
            return [
                f"kind: host pool {type(mine).__name__}, device pool {type(device_pool).__name__}"
            ]
        layers = (mine.layers_mapping, mine.start_layer)
        theirs = (device_pool.layers_mapping, device_pool.start_layer)
        if theirs != layers:
            return [
                f"layers (layers_mapping, start_layer): host pool {layers}, device pool {theirs}"
            ]
        return [
            entry
            for host, dev in zip(self.host_pools, device_pool.inner_pools, strict=True)
            for entry in host.mismatch(dev)
        ]


def _slot_bytes(pool: KVPool) -> int:
    """Bytes of one token of ``pool`` in a host pool: every part of every layer."""
    geometry = pool.geometry
    return geometry.layer_num * geometry.item_size * geometry.parts
