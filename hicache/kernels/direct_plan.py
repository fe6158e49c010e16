"""Plan once, run per layer: the per-layer direct ops over every layer of one load batch.

:func:`plan_direct` (``transfer_kv_direct`` once per layer) and :func:`plan_direct_pf_lf`
(``transfer_kv_per_layer_direct_pf_lf`` once per layer) run every check of the op once: on
layer 0 (the last layer of a page_first_direct source), and that every other layer's tensors are
laid out like layer 0's. They compute the runs once (one copy of the indices to the CPU) and pick
the copy path once; :meth:`DirectLayerPlan.run` checks only the layer id, then copies. A
:class:`DirectPlanner` (``direct_planner``, ``direct_pf_lf_planner``) keeps the checked tensors of
every layer for many batches: its ``plan`` checks the indices and computes the runs only.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hicache.kernels import copy_engine
from hicache.kernels import validate as check
from hicache.kernels.direct import check_lf_pairs, check_pf_lf_pairs, checked_runs
from hicache.kernels.direct_runs import EngineBatch, Pairs, Runs, Slots, engine_device

Tensor = torch.Tensor


@dataclass(frozen=True)
class DirectLayerPlan:
    """Validated direct copies of layers ``0 .. num_layers - 1``.

    Attributes
    ----------
    layer_pairs : layer ``l``'s (source, destination) slot views.
    runs : the runs every layer copies (CPU int64 arrays).
    engine : the CUDA device of a batched copy-engine call, or None (one ``copy_`` per run).
    """

    layer_pairs: tuple[Pairs, ...]
    runs: Runs
    engine: torch.device | None

    @property
    def num_layers(self) -> int:
        return len(self.layer_pairs)

    def run(self, layer_id: int) -> None:
        """Copy layer ``layer_id`` (``IndexError`` outside ``[0, num_layers)``), nothing else
        checked. The engine copies' addresses are computed for every layer at the first run."""
        layer = check.check_layer_id(layer_id, self.num_layers)
        if self.engine is None or not len(self.runs.lengths):
            self.runs.copy(self.layer_pairs[layer], self.engine)
        else:
            copy_engine.copy_batch(*self._batches[layer], self.engine)

    @functools.cached_property
    def _batches(self) -> list[EngineBatch]:
        return self.runs.engine_batches(self.layer_pairs)


def _layers(name: str, value: object) -> list[dict[str, Tensor]]:
    """``value`` (a non-empty sequence of per-layer tensor lists) as per-layer dicts."""
    if not isinstance(value, Sequence) or not value:
        raise TypeError(f"{name} must be a non-empty sequence of per-layer tensor lists")
    for layer, tensors in enumerate(value):
        if not isinstance(tensors, (list, tuple)):
            raise TypeError(f"{name}[{layer}] must be a list of tensors")
    return [{str(j): t for j, t in enumerate(tensors)} for tensors in value]


def _is_cuda(pairs: Pairs) -> bool:
    return any(side.tensor.is_cuda for pair in pairs for side in pair)


@dataclass(frozen=True)
class DirectPlanner:
    """Every layer's tensors of a per-layer direct copy, validated once (``direct_planner``,
    ``direct_pf_lf_planner``); :meth:`plan` then checks one batch's indices and computes its runs.
    Valid while those tensors are the same, unchanged ones."""

    pairs: Pairs  # the checked template layer's pairs (they bound the indices)
    page: int
    layer_pairs: tuple[Pairs, ...]
    engine: torch.device | None

    def plan(self, src_indices: Tensor, dst_indices: Tensor) -> DirectLayerPlan:
        runs = checked_runs(self.pairs, src_indices, dst_indices, self.page)
        return DirectLayerPlan(self.layer_pairs, runs, self.engine)


def direct_planner(
    src_layers: Sequence[list[Tensor]], dst_layers: Sequence[list[Tensor]], page_size: int
) -> DirectPlanner:
    """The planner of :func:`plan_direct` for these tensors."""
    src, dst = _layers("src_layers", src_layers), _layers("dst_layers", dst_layers)
    pairs, page = check_lf_pairs(src_layers[0], dst_layers[0], page_size)
    if len(src) != len(dst):
        raise ValueError(f"src_layers and dst_layers differ in length: {len(src)} != {len(dst)}")
    cuda = _is_cuda(pairs)
    layers = zip(
        check.check_layer_buffers("src_layers", src, cuda),
        check.check_layer_buffers("dst_layers", dst, cuda),
        strict=True,
    )
    layer_pairs = tuple(
        tuple((Slots(s), Slots(d)) for s, d in zip(srcs, dsts, strict=True))
        for srcs, dsts in layers
    )
    return DirectPlanner(pairs, page, layer_pairs, engine_device(pairs))


def plan_direct(
    src_layers: Sequence[list[Tensor]],
    dst_layers: Sequence[list[Tensor]],
    src_indices: Tensor,
    dst_indices: Tensor,
    page_size: int,
) -> DirectLayerPlan:
    """``transfer_kv_direct(src_layers[l], dst_layers[l], ...)`` for every layer ``l``."""
    return direct_planner(src_layers, dst_layers, page_size).plan(src_indices, dst_indices)


def direct_pf_lf_planner(
    src_ptrs: list[Tensor], dst_layers: Sequence[list[Tensor]], page_size: int
) -> DirectPlanner:
    """The planner of :func:`plan_direct_pf_lf` for these tensors."""
    dst = _layers("dst_layers", dst_layers)
    last = len(dst) - 1
    pairs, page = check_pf_lf_pairs(src_ptrs, dst_layers[last], last, page_size)
    if len(pairs) != len(src_ptrs):  # the op could take several layers per call; a plan one
        raise ValueError(
            f"dst_layers[l] must hold one tensor per src_ptrs buffer ({len(src_ptrs)}), "
            f"got {len(pairs)}"
        )
    dsts = check.check_layer_buffers("dst_layers", dst, _is_cuda(pairs))
    layer_pairs = tuple(
        tuple((Slots(src.tensor, layer), Slots(d)) for (src, _), d in zip(pairs, ds, strict=True))
        for layer, ds in enumerate(dsts)
    )
    return DirectPlanner(pairs, page, layer_pairs, engine_device(pairs))


def plan_direct_pf_lf(
    src_ptrs: list[Tensor],
    dst_layers: Sequence[list[Tensor]],
    src_indices: Tensor,
    dst_indices: Tensor,
    page_size: int,
) -> DirectLayerPlan:
    """``transfer_kv_per_layer_direct_pf_lf(src_ptrs, dst_layers[l], ..., l, page_size)`` for
    layers ``0 .. len(dst_layers) - 1`` of the page_first_direct ``src_ptrs``."""
    planner = direct_pf_lf_planner(src_ptrs, dst_layers, page_size)
    return planner.plan(src_indices, dst_indices)
