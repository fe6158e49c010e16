"""Plan once, run per layer: a validated host -> device load of every layer of one batch.

:meth:`HostKVPool.plan_load <hicache.pools.HostKVPool.plan_load>` runs every check of
``load_to_device_per_layer`` but the layer id once, moves the indices once, and builds the
kernel plan (:mod:`hicache.kernels.layer_plan`, :mod:`hicache.kernels.direct_plan`) once;
:meth:`LoadPlan.run` then only checks the layer id and copies. Same routes as
:mod:`hicache.pools.layer_ops`, on CPU and CUDA alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from hicache import kernels
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


def plan_load(host: HostBuffers, dev: KVPool, h: Tensor, d: Tensor, io_backend: str) -> LayerRunner:
    """Validate and plan the load of every layer of ``h`` -> ``d`` (a ``kernels`` plan)."""
    layers = range(dev.layer_num)
    dst = [_layer(dev.part_buffers, layer) for layer in layers]
    if io_backend == "direct":
        if host.layout == "layer_first":
            src = [_layer(host.host_parts, layer) for layer in layers]
            return kernels.plan_direct(src, dst, h, d, host.page_size)
        return kernels.plan_direct_pf_lf(host.host_parts, dst, h, d, host.page_size)
    dst_named = [_named("dst", parts) for parts in dst]
    if host.layout == "layer_first":
        src_named = [_named("src", _layer(host.host_parts, layer)) for layer in layers]
        return kernels.plan_per_layer(src_named, dst_named, h, d, host.item_size)
    whole = _named("src", host.host_parts)
    if host.layout == "page_first":
        return kernels.plan_per_layer_pf_lf(whole, dst_named, h, d, host.item_size, host.layout_dim)
    return kernels.plan_per_layer_ph_lf(
        whole, dst_named, h, d, host.item_size, host.layout_dim, host.page_size, host.head_num
    )
