"""Plan once, run per layer: a validated host -> device load of every layer of one batch.

:meth:`HostKVPool.plan_load <hicache.pools.HostKVPool.plan_load>` runs every check of
``load_to_device_per_layer`` but the layer id once, moves the indices once, and builds the
kernel plan (:mod:`hicache.kernels.layer_plan`, :mod:`hicache.kernels.direct_plan`) once;
:meth:`LoadPlan.run` then only checks the layer id and copies. Same routes as
:mod:`hicache.pools.layer_ops`, on CPU and CUDA alike.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from hicache.kernels.direct_plan import DirectPlanner, direct_pf_lf_planner, direct_planner
from hicache.kernels.layer_plan import (
    LayerPlanner,
    per_layer_pf_lf_planner,
    per_layer_ph_lf_planner,
    per_layer_planner,
)
from hicache.pools.device_pool import KVPool
from hicache.pools.layer_ops import HostBuffers

Tensor = torch.Tensor


class LayerRunner(Protocol):
    """A load planned for every layer; ``run(l)`` copies layer ``l`` (checks only ``l``)."""

    def run(self, layer_id: int) -> None: ...


@dataclass(frozen=True)
class LoadPlan:
    """One validated load batch from ``host_pool`` into ``device_pool``, every layer.

    Build it (``HostKVPool.plan_load``) on the stream the layers will run on: the indices were
    moved there, non-blocking, at plan time. The slots must stay allocated until the last layer
    has landed.
    """

    host_pool: HostBuffers
    device_pool: KVPool
    runner: LayerRunner
    device_indices: Tensor  # the destination slots, where the runner needs them

    @property
    def num_layers(self) -> int:
        return self.device_pool.layer_num

    def run(self, layer_id: int) -> None:
        """Copy layer ``layer_id`` on the current stream (asynchronous on CUDA).

        Raises ``TypeError``/``ValueError`` for a layer id that is not an int in
        ``[0, num_layers)`` and ``RuntimeError`` once the host pool is closed; nothing else is
        checked again.
        """
        if self.host_pool.closed:
            raise RuntimeError("this host pool is closed")
        self.device_pool.check_layer(layer_id)
        self.runner.run(layer_id)


def _named(prefix: str, parts: Sequence[Tensor]) -> dict[str, Tensor]:
    """The op's argument names for ``parts``: ``{prefix}_k``/``_v`` (MHA), ``prefix`` (MLA)."""
    if len(parts) == 1:
        return {prefix: parts[0]}
    return {f"{prefix}_k": parts[0], f"{prefix}_v": parts[1]}


def _layer(parts: Sequence[Sequence[Tensor]] | Sequence[Tensor], layer: int) -> list[Tensor]:
    return [part[layer] for part in parts]


def _layer_buffers(dev: KVPool) -> list[Tensor]:
    return [buffer for part in dev.part_buffers for buffer in part]


class LoadPlanner:
    """The load routes of one (host pool, device pool) pair, every layer's buffers validated
    once per io_backend (at its first plan): ``plan`` then checks only a batch's indices.

    A host pool keeps one per device pool (it holds their buffers, not the pools);
    ``fits(dev)`` tells whether ``dev`` still holds the layer buffers it was built with (the
    same tensors), else it must be built again.
    """

    def __init__(self, dev: KVPool) -> None:
        self._buffers = _layer_buffers(dev)
        self._planners: dict[str, LayerPlanner | DirectPlanner] = {}

    def fits(self, dev: KVPool) -> bool:
        buffers = _layer_buffers(dev)
        return len(buffers) == len(self._buffers) and all(map(operator.is_, buffers, self._buffers))

    def plan(
        self, host: HostBuffers, dev: KVPool, h: Tensor, d: Tensor, io_backend: str
    ) -> LayerRunner:
        """Plan the load of every layer of ``h`` -> ``d`` (a ``kernels`` plan) for the pools
        this planner was built for (``fits(dev)``)."""
        kind = "direct" if io_backend == "direct" else "kernel"
        planner = self._planners.get(kind)
        if planner is None:
            build = _direct_planner if kind == "direct" else _kernel_planner
            planner = self._planners[kind] = build(host, dev)
        return planner.plan(h, d)


class LoadPlanners:
    """A host pool's :class:`LoadPlanner` of each device pool it loads into (weakly keyed: the
    planners do not keep the device pools alive)."""

    def __init__(self) -> None:
        self._of = weakref.WeakKeyDictionary[KVPool, LoadPlanner]()

    def plan(
        self, host: HostBuffers, dev: KVPool, h: Tensor, d: Tensor, io_backend: str
    ) -> LayerRunner:
        """``LoadPlanner.plan`` of ``dev``'s planner, built first when it has none or its
        buffers are other tensors."""
        planner = self._of.get(dev)
        if planner is None or not planner.fits(dev):
            planner = self._of[dev] = LoadPlanner(dev)
        return planner.plan(host, dev, h, d, io_backend)


def _dst(dev: KVPool) -> list[list[Tensor]]:
    return [_layer(dev.part_buffers, layer) for layer in range(dev.layer_num)]


def _direct_planner(host: HostBuffers, dev: KVPool) -> DirectPlanner:
    dst = _dst(dev)
    if host.layout == "layer_first":
        src = [_layer(host.host_parts, layer) for layer in range(len(dst))]
        return direct_planner(src, dst, host.page_size)
    return direct_pf_lf_planner(host.host_parts, dst, host.page_size)


def _kernel_planner(host: HostBuffers, dev: KVPool) -> LayerPlanner:
    dst = [_named("dst", parts) for parts in _dst(dev)]
    if host.layout == "layer_first":
        src = [_named("src", _layer(host.host_parts, layer)) for layer in range(len(dst))]
        return per_layer_planner(src, dst, host.item_size)
    whole = _named("src", host.host_parts)
    if host.layout == "page_first":
        return per_layer_pf_lf_planner(whole, dst, host.item_size, host.layout_dim)
    dims = (host.item_size, host.layout_dim, host.page_size, host.head_num)
    return per_layer_ph_lf_planner(whole, dst, *dims)
