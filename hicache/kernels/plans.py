"""Turn the arguments of one non-direct op into a validated :class:`CopyPlan`.

One planner per layout pair; MHA passes ``{"src_k": ..., "src_v": ...}`` and MLA a single
``{"src": ...}``, so K and V travel together. Every check runs here, before any byte moves.
"""

from __future__ import annotations

import torch

from hicache.checks import check_int
from hicache.kernels import validate as check
from hicache.kernels.layouts import (
    CopyPlan,
    Geometry,
    Operand,
    layer_first,
    page_first,
    page_head,
)

Named = dict[str, torch.Tensor]


def _tensor_side(named: Named, geometry: Geometry, first_layer: int = 0) -> Operand:
    check.check_data(named, geometry.page_stride)
    first = next(iter(named.values()))
    return Operand(
        tuple(named),
        tuple(named.values()),
        False,
        geometry,
        first.shape[0] * geometry.page,
        first_layer,
    )


def _table_side(
    named: Named, geometry: Geometry, num_layers: int, items_name: str, items: object
) -> Operand:
    """A pointer-table side; ``items`` (argument ``items_name``) bounds its item index, or None:
    the buffers behind the addresses are then unknown, and so is their item count."""
    check.check_tables(named, num_layers)
    limit = None if items is None else check_int(items_name, items, minimum=1)
    return Operand(tuple(named), tuple(named.values()), True, geometry, limit)


def _layout_dim(name: str, value: object, item_size: int) -> int:
    """A ``*_layout_dim`` argument: a positive multiple of ``item_size``."""
    layout_dim = check_int(name, value, minimum=1)
    check.check_divides(name, layout_dim, "item_size", item_size)
    return layout_dim


def _heads(head_num: object, item_size: int) -> int:
    heads = check_int("head_num", head_num, minimum=1)
    check.check_divides("item_size", item_size, "head_num", heads)
    return heads


def _plan(
    src: Operand,
    dst: Operand,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    num_layers: int,
    heads: int,
    item_size: int,
) -> CopyPlan:
    check.check_indices(src_indices, dst_indices)
    data = [pair for side in (src, dst) if not side.is_table for pair in side.named()]
    for name, tensor in data[1:]:
        if tensor.dtype != data[0][1].dtype:
            raise ValueError(
                f"{name} is {tensor.dtype} but {data[0][0]} is {data[0][1].dtype}; "
                "source and destination must share one dtype"
            )
    device = check.check_devices(src, dst, {"src_indices": src_indices, "dst_indices": dst_indices})
    _check_ranges(src, dst, src_indices, dst_indices)
    return CopyPlan(
        src, dst, src_indices, dst_indices, num_layers, heads, item_size // heads, device
    )


def _check_ranges(
    src: Operand, dst: Operand, src_indices: torch.Tensor, dst_indices: torch.Tensor
) -> None:
    for name, idx, side in (("src_indices", src_indices, src), ("dst_indices", dst_indices, dst)):
        check.check_index_range(name, idx, side.num_items)


def check_plan_indices(plan: CopyPlan, src_indices: object, dst_indices: object) -> None:
    """The checks ``plan``'s op runs on its indices, for ``src_indices`` / ``dst_indices`` in
    place of ``plan``'s (whose buffers were validated when it was planned and are the same,
    unchanged tensors): their type, dtype and lengths, devices and ranges."""
    check.check_indices(src_indices, dst_indices)
    assert isinstance(src_indices, torch.Tensor) and isinstance(dst_indices, torch.Tensor)
    named = {"src_indices": src_indices, "dst_indices": dst_indices}
    check.check_index_devices(named, plan.device)
    _check_ranges(plan.src, plan.dst, src_indices, dst_indices)


def per_layer(
    src: Named, dst: Named, src_indices: torch.Tensor, dst_indices: torch.Tensor, item_size: object
) -> CopyPlan:
    """layer_first -> layer_first, one layer: ``src``/``dst`` are ``[items, ...]`` tensors."""
    size = check.check_item_size(item_size)
    geometry = layer_first(size)
    return _plan(
        _tensor_side(src, geometry),
        _tensor_side(dst, geometry),
        src_indices,
        dst_indices,
        1,
        1,
        size,
    )


def per_layer_pf_lf(
    src: Named,
    dst: Named,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    layer_id: object,
    item_size: object,
    src_layout_dim: object,
) -> CopyPlan:
    """page_first ``[items, layers, ...]`` layer ``layer_id`` -> one layer_first layer."""
    size = check.check_item_size(item_size)
    layout_dim = _layout_dim("src_layout_dim", src_layout_dim, size)
    layer = check.check_layer_id(layer_id, layout_dim // size)
    source = _tensor_side(src, page_first(size, layout_dim), layer)
    return _plan(source, _tensor_side(dst, layer_first(size)), src_indices, dst_indices, 1, 1, size)


def per_layer_ph_lf(
    src: Named,
    dst: Named,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    layer_id: object,
    item_size: object,
    src_layout_dim: object,
    page_size: object,
    head_num: object,
) -> CopyPlan:
    """page_head ``[pages, heads, page_size, layers, head_dim]`` layer ``layer_id`` -> lf."""
    size = check.check_item_size(item_size)
    layout_dim = _layout_dim("src_layout_dim", src_layout_dim, size)
    layer = check.check_layer_id(layer_id, layout_dim // size)
    page = check_int("page_size", page_size, minimum=1)
    heads = _heads(head_num, size)
    source = _tensor_side(src, page_head(size, layout_dim, page, heads), layer)
    return _plan(
        source,
        _tensor_side(dst, layer_first(size, heads)),
        src_indices,
        dst_indices,
        1,
        heads,
        size,
    )


def all_layer(
    src: Named,
    dst: Named,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    item_size: object,
    num_layers: object,
    src_items: object,
    dst_items: object,
) -> CopyPlan:
    """layer_first -> layer_first for every layer; both sides are uint64 pointer tables of
    ``src_items`` / ``dst_items`` items per layer (None: unknown)."""
    size = check.check_item_size(item_size)
    layers = check_int("num_layers", num_layers, minimum=1)
    geometry = layer_first(size)
    return _plan(
        _table_side(src, geometry, layers, "src_items_per_layer", src_items),
        _table_side(dst, geometry, layers, "dst_items_per_layer", dst_items),
        src_indices,
        dst_indices,
        layers,
        1,
        size,
    )


def _all_layer_dim(dst_layout_dim: object, size: int, layers: int) -> int:
    layout_dim = check_int("dst_layout_dim", dst_layout_dim, minimum=1)
    if layout_dim != size * layers:
        raise ValueError(
            f"dst_layout_dim ({layout_dim}) must equal item_size * num_layers ({size * layers})"
        )
    return layout_dim


def all_layer_lf_pf(
    src: Named,
    dst: Named,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    item_size: object,
    dst_layout_dim: object,
    num_layers: object,
    src_items: object,
) -> CopyPlan:
    """layer_first pointer tables (``src_items`` per layer, None: unknown) -> page_first
    ``[items, layers, ...]``, every layer."""
    size = check.check_item_size(item_size)
    layers = check_int("num_layers", num_layers, minimum=1)
    layout_dim = _all_layer_dim(dst_layout_dim, size, layers)
    return _plan(
        _table_side(src, layer_first(size), layers, "src_items_per_layer", src_items),
        _tensor_side(dst, page_first(size, layout_dim)),
        src_indices,
        dst_indices,
        layers,
        1,
        size,
    )


def all_layer_lf_ph(
    src: Named,
    dst: Named,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    item_size: object,
    dst_layout_dim: object,
    num_layers: object,
    page_size: object,
    head_num: object,
    src_items: object,
) -> CopyPlan:
    """layer_first pointer tables (``src_items`` per layer, None: unknown) -> page_head
    ``[pages, heads, page_size, layers, head_dim]``."""
    size = check.check_item_size(item_size)
    layers = check_int("num_layers", num_layers, minimum=1)
    layout_dim = _all_layer_dim(dst_layout_dim, size, layers)
    page = check_int("page_size", page_size, minimum=1)
    heads = _heads(head_num, size)
    source = _table_side(src, layer_first(size, heads), layers, "src_items_per_layer", src_items)
    return _plan(
        source,
        _tensor_side(dst, page_head(size, layout_dim, page, heads)),
        src_indices,
        dst_indices,
        layers,
        heads,
        size,
    )
