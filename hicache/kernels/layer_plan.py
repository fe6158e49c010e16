"""Plan once, run per layer: the per-layer kernel ops over every layer of one load batch.

``transfer_kv_per_layer*`` validate and plan on every call. A load batch makes the same call once
per layer with the same indices, so the planners here run every check of the op once, for all
layers (layer 0 of a layer_first side, the last layer of a page_first / page_head source, and
that every other layer's buffers are laid out like layer 0's), move the indices to the copy's
device once, and return a :class:`LayerPlan` whose :meth:`~LayerPlan.run` checks only the layer
id and launches. Arguments are those of the matching op, with MHA passing ``{"src_k": ...,
"src_v": ...}`` and MLA ``{"src": ...}`` (names as the op's parameters), and a layer_first side
given as one such dict per layer.

Many batches over the same buffers: a :class:`LayerPlanner` (``*_planner``) validates the buffers
of every layer once (the template layer's with the op's own checks), and its
``plan(src_indices, dst_indices)`` then checks only the indices, as the op checks them
(``plans.check_plan_indices``); ``plan_per_layer*`` build one and plan once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from hicache.kernels import dispatch, plans
from hicache.kernels import validate as check
from hicache.kernels.layouts import CopyPlan, Operand
from hicache.kernels.ops import DEFAULT_NUM_WARPS

if TYPE_CHECKING:  # at run time imported where a launch is prepared: it imports Triton
    from hicache.kernels import triton_ops

Tensor = torch.Tensor
Named = dict[str, Tensor]
Layers = tuple[tuple[Tensor, ...], ...]


@dataclass(frozen=True)
class LayerPlan:
    """A validated per-layer copy of layers ``0 .. num_layers - 1``; see the module.

    Attributes
    ----------
    template : the validated plan of one layer; its indices already on ``template.device``.
    src_layers : layer ``l``'s source buffers (a layer_first source), or None: the source is one
        page_first / page_head buffer set and layer ``l`` is its layer ``l``.
    dst_layers : layer ``l``'s destination buffers (layer_first).
    block_quota, num_warps_per_block : checked launch arguments.
    """

    template: CopyPlan
    src_layers: Layers | None
    dst_layers: Layers
    block_quota: int
    num_warps_per_block: int
    launcher_of: Callable[[LayerPlan], triton_ops.Launcher] | None = None  # see LayerPlanner

    @property
    def num_layers(self) -> int:
        return len(self.dst_layers)

    def at(self, layer_id: int) -> CopyPlan:
        """The plan of layer ``layer_id`` (``IndexError`` outside ``[0, num_layers)``)."""
        layer = check.check_layer_id(layer_id, self.num_layers)
        src, dst = self.template.src, self.template.dst
        if self.src_layers is None:
            src = _at(src, src.buffers, layer)
        else:
            src = _at(src, self.src_layers[layer], 0)
        return replace(self.template, src=src, dst=_at(dst, self.dst_layers[layer], 0))

    def run(self, layer_id: int) -> None:
        """Copy layer ``layer_id``: the only check is the layer id. Same backends as the ops;
        the Triton launch is prepared once, at the first run, for every layer."""
        layer = check.check_layer_id(layer_id, self.num_layers)
        if self.template.num_items and dispatch.backend_for(self.template) == "triton":
            self._launcher.run(layer)
        else:
            dispatch.run(self.at(layer), self.block_quota, self.num_warps_per_block)

    def addresses(self, layer: int) -> triton_ops.Addresses:
        """Layer ``layer``'s (src K, src V, dst K, dst V) addresses: ``triton_ops.addresses``
        of ``at(layer)``, without building its plan (no check of ``layer``)."""
        if self.src_layers is None:  # one page_first / page_head buffer set: its layer ``layer``
            src = self.template.src
            offset = layer * src.geometry.layer_stride
            k, v = src.buffers[0].data_ptr() + offset, src.buffers[-1].data_ptr() + offset
        else:
            k, v = self.src_layers[layer][0].data_ptr(), self.src_layers[layer][-1].data_ptr()
        dst = self.dst_layers[layer]
        return k, v, dst[0].data_ptr(), dst[-1].data_ptr()

    @functools.cached_property
    def _launcher(self) -> triton_ops.Launcher:
        if self.launcher_of is not None:
            return self.launcher_of(self)
        return self.new_launcher()

    def new_launcher(self) -> triton_ops.Launcher:
        """The Triton launch of every layer, prepared from scratch."""
        from hicache.kernels import triton_ops

        layers = [self.addresses(layer) for layer in range(self.num_layers)]
        prepared = triton_ops.prepare(
            self.template, layers, self.block_quota, self.num_warps_per_block
        )
        return triton_ops.Launcher(self.template, prepared)


def _at(side: Operand, buffers: tuple[Tensor, ...], first_layer: int) -> Operand:
    return Operand(side.names, buffers, False, side.geometry, side.num_items, first_layer)


TemplateOf = Callable[[Tensor, Tensor], CopyPlan]  # the op's checked plan of layer 0 (or last)


class LayerPlanner:
    """Every layer's buffers of a per-layer copy, validated once; :meth:`plan` then plans one
    batch of indices. Build it with a ``*_planner`` function below.

    ``template_of(src_indices, dst_indices)`` runs the op's checks on the template layer;
    construction runs it once, with no indices, and checks every layer against it. A planner
    stays valid while the buffers it was given are the same, unchanged tensors: keep one per
    buffer set (a host pool keeps one per device pool) to plan each batch with its index checks
    only.
    """

    def __init__(
        self,
        template_of: TemplateOf,
        src_layers: Sequence[Named] | None,
        dst_layers: Sequence[Named],
        block_quota: object,
        num_warps_per_block: object,
    ) -> None:
        check.check_launch(block_quota, num_warps_per_block)
        assert isinstance(block_quota, int) and isinstance(num_warps_per_block, int)
        empty = torch.empty(0, dtype=torch.int64)
        self._template = template_of(empty, empty)  # every check but the indices'
        cuda = self._template.device.type == "cuda"
        src = (
            None
            if src_layers is None
            else check.check_layer_buffers("src_layers", src_layers, cuda)
        )
        dst = check.check_layer_buffers("dst_layers", dst_layers, cuda)
        if src is not None and len(src) != len(dst):
            raise ValueError(
                f"src_layers and dst_layers differ in length: {len(src)} != {len(dst)}"
            )
        self._layers = (src, dst)
        self._launch = (block_quota, num_warps_per_block)
        self._prepared: triton_ops.Prepared | None = None  # the launch of the first plan run

    def plan(self, src_indices: Tensor, dst_indices: Tensor) -> LayerPlan:
        """The plan of every layer for ``src_indices`` -> ``dst_indices`` (checked as the op
        checks them), the indices moved (non-blocking) to the copy's device."""
        plans.check_plan_indices(self._template, src_indices, dst_indices)
        device = self._template.device
        template = replace(
            self._template,
            src_indices=src_indices.to(device, non_blocking=True).contiguous(),
            dst_indices=dst_indices.to(device, non_blocking=True).contiguous(),
        )
        return LayerPlan(template, *self._layers, *self._launch, self._launcher_of)

    def _launcher_of(self, plan: LayerPlan) -> triton_ops.Launcher:
        """``plan``'s launcher: prepared once, for the first plan launched, then reused."""
        if self._prepared is None:
            launcher = plan.new_launcher()
            self._prepared = launcher.prepared
            return launcher
        from hicache.kernels import triton_ops

        return triton_ops.Launcher(plan.template, self._prepared)


def _first(name: str, layers: Sequence[Named]) -> Named:
    if not isinstance(layers, Sequence) or not layers:
        raise TypeError(f"{name} must be a non-empty sequence of per-layer buffer dicts")
    return layers[0]


def per_layer_planner(
    src_layers: Sequence[Named],
    dst_layers: Sequence[Named],
    item_size: int,
    block_quota: int = 2,
    num_warps_per_block: int = DEFAULT_NUM_WARPS,
) -> LayerPlanner:
    """The planner of :func:`plan_per_layer` for these buffers."""
    src, dst = _first("src_layers", src_layers), _first("dst_layers", dst_layers)

    def template_of(src_indices: Tensor, dst_indices: Tensor) -> CopyPlan:
        return plans.per_layer(src, dst, src_indices, dst_indices, item_size)

    return LayerPlanner(template_of, src_layers, dst_layers, block_quota, num_warps_per_block)


def plan_per_layer(
    src_layers: Sequence[Named],
    dst_layers: Sequence[Named],
    src_indices: Tensor,
    dst_indices: Tensor,
    item_size: int,
    block_quota: int = 2,
    num_warps_per_block: int = DEFAULT_NUM_WARPS,
) -> LayerPlan:
    """``transfer_kv_per_layer`` (``_mla``) for every layer: layer ``l`` copies
    ``src_layers[l]`` into ``dst_layers[l]`` (``[items, ...]`` tensors)."""
    planner = per_layer_planner(src_layers, dst_layers, item_size, block_quota, num_warps_per_block)
    return planner.plan(src_indices, dst_indices)


def per_layer_pf_lf_planner(
    src: Named,
    dst_layers: Sequence[Named],
    item_size: int,
    src_layout_dim: int,
    block_quota: int = 2,
    num_warps_per_block: int = DEFAULT_NUM_WARPS,
) -> LayerPlanner:
    """The planner of :func:`plan_per_layer_pf_lf` for these buffers."""
    _first("dst_layers", dst_layers)
    last = len(dst_layers) - 1

    def template_of(src_indices: Tensor, dst_indices: Tensor) -> CopyPlan:
        return plans.per_layer_pf_lf(
            src, dst_layers[last], src_indices, dst_indices, last, item_size, src_layout_dim
        )

    return LayerPlanner(template_of, None, dst_layers, block_quota, num_warps_per_block)


def plan_per_layer_pf_lf(
    src: Named,
    dst_layers: Sequence[Named],
    src_indices: Tensor,
    dst_indices: Tensor,
    item_size: int,
    src_layout_dim: int,
    block_quota: int = 2,
    num_warps_per_block: int = DEFAULT_NUM_WARPS,
) -> LayerPlan:
    """``transfer_kv_per_layer_pf_lf`` (``_mla_pf_lf``) for layers ``0 .. len(dst_layers) - 1``
    of the page_first ``src`` (each must be one of its layers)."""
    planner = per_layer_pf_lf_planner(
        src, dst_layers, item_size, src_layout_dim, block_quota, num_warps_per_block
    )
    return planner.plan(src_indices, dst_indices)


def per_layer_ph_lf_planner(
    src: Named,
    dst_layers: Sequence[Named],
    item_size: int,
    src_layout_dim: int,
    page_size: int,
    head_num: int,
    block_quota: int = 2,
    num_warps_per_block: int = DEFAULT_NUM_WARPS,
) -> LayerPlanner:
    """The planner of :func:`plan_per_layer_ph_lf` for these buffers."""
    _first("dst_layers", dst_layers)
    last = len(dst_layers) - 1
    dims = (item_size, src_layout_dim, page_size, head_num)

    def template_of(src_indices: Tensor, dst_indices: Tensor) -> CopyPlan:
        return plans.per_layer_ph_lf(src, dst_layers[last], src_indices, dst_indices, last, *dims)

    return LayerPlanner(template_of, None, dst_layers, block_quota, num_warps_per_block)


def plan_per_layer_ph_lf(
    src: Named,
    dst_layers: Sequence[Named],
    src_indices: Tensor,
    dst_indices: Tensor,
    item_size: int,
    src_layout_dim: int,
    page_size: int,
    head_num: int,
    block_quota: int = 2,
    num_warps_per_block: int = DEFAULT_NUM_WARPS,
) -> LayerPlan:
    """``transfer_kv_per_layer_ph_lf`` for layers ``0 .. len(dst_layers) - 1`` of the
    page_head ``src``."""
    dims = (item_size, src_layout_dim, page_size, head_num)
    planner = per_layer_ph_lf_planner(src, dst_layers, *dims, block_quota, num_warps_per_block)
    return planner.plan(src_indices, dst_indices)
