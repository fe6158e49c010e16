"""The five all-layer kernel ops (every layer of a batch in one launch); the contract shared
by every kernel op is in :mod:`hicache.kernels.ops`."""

from __future__ import annotations

import torch

from hicache.kernels import plans
from hicache.kernels.dispatch import execute
from hicache.kernels.ops import DEFAULT_NUM_WARPS

Tensor = torch.Tensor


def transfer_kv_all_layer(
    src_k_layers: Tensor,
    dst_k_layers: Tensor,
    src_v_layers: Tensor,
    dst_v_layers: Tensor,
    src_indices: Tensor,
    dst_indices: Tensor,
    item_size: int,
    num_layers: int,
    block_quota: int = 2,
    num_warps_per_block: int = DEFAULT_NUM_WARPS,
    *,
    src_items_per_layer: int | None = None,
    dst_items_per_layer: int | None = None,
) -> None:
    """Every layer, layer_first to layer_first.

    Parameters
    ----------
    src_k_layers, dst_k_layers, src_v_layers, dst_v_layers : uint64 ``[num_layers]`` pointer
        tables; entry ``l`` is the address of layer ``l``'s ``[items, ...]`` buffer.
    num_layers : int >= 1.
    src_items_per_layer, dst_items_per_layer : items of each source / destination layer buffer;
        None leaves indices past the end unchecked (see the module).
    src_indices, dst_indices, item_size, block_quota, num_warps_per_block : see the module.
    """
    plan = plans.all_layer(
        {"src_k_layers": src_k_layers, "src_v_layers": src_v_layers},
        {"dst_k_layers": dst_k_layers, "dst_v_layers": dst_v_layers},
        src_indices,
        dst_indices,
        item_size,
        num_layers,
        src_items_per_layer,
        dst_items_per_layer,
    )
    execute(plan, block_quota, num_warps_per_block)


def transfer_kv_all_layer_lf_pf(
    src_k_layers: Tensor,
    dst_k: Tensor,
    src_v_layers: Tensor,
    dst_v: Tensor,
    src_indices: Tensor,
    dst_indices: Tensor,
    item_size: int,
    dst_layout_dim: int,
    num_layers: int,
    block_quota: int = 2,
    num_warps_per_block: int = DEFAULT_NUM_WARPS,
    *,
    src_items_per_layer: int | None = None,
) -> None:
    """Every layer from layer_first pointer tables into page_first.

    Parameters
    ----------
    src_k_layers, src_v_layers : uint64 ``[num_layers]`` pointer tables of layer_first buffers.
    dst_k, dst_v : ``[dst_items, num_layers, ...]`` page_first.
    dst_layout_dim : ``num_layers * item_size``.
    num_layers : int >= 1.
    src_items_per_layer : items of each source layer buffer; None leaves source indices past
        the end unchecked (see the module).
    src_indices, dst_indices, item_size, block_quota, num_warps_per_block : see the module.
    """
    plan = plans.all_layer_lf_pf(
        {"src_k_layers": src_k_layers, "src_v_layers": src_v_layers},
        {"dst_k": dst_k, "dst_v": dst_v},
        src_indices,
        dst_indices,
        item_size,
        dst_layout_dim,
        num_layers,
        src_items_per_layer,
    )
    execute(plan, block_quota, num_warps_per_block)


def transfer_kv_all_layer_lf_ph(
    src_k_layers: Tensor,
    dst_k: Tensor,
    src_v_layers: Tensor,
    dst_v: Tensor,
    src_indices: Tensor,
    dst_indices: Tensor,
    item_size: int,
    dst_layout_dim: int,
    num_layers: int,
    page_size: int,
    head_num: int,
    block_quota: int = 2,
    num_warps_per_block: int = DEFAULT_NUM_WARPS,
    *,
    src_items_per_layer: int | None = None,
) -> None:
    """Every layer from layer_first pointer tables into page_head.

    Parameters
    ----------
    src_k_layers, src_v_layers : uint64 ``[num_layers]`` pointer tables of layer_first buffers.
    dst_k, dst_v : ``[pages, head_num, page_size, num_layers, head_dim]``, offsets as in
        :func:`transfer_kv_per_layer_ph_lf`.
    dst_layout_dim : ``num_layers * item_size``.
    num_layers, page_size, head_num : ints >= 1; ``head_num`` divides ``item_size``.
    src_items_per_layer : as in :func:`transfer_kv_all_layer_lf_pf`.
    src_indices, dst_indices, item_size, block_quota, num_warps_per_block : see the module.
    """
    plan = plans.all_layer_lf_ph(
        {"src_k_layers": src_k_layers, "src_v_layers": src_v_layers},
        {"dst_k": dst_k, "dst_v": dst_v},
        src_indices,
        dst_indices,
        item_size,
        dst_layout_dim,
        num_layers,
        page_size,
        head_num,
        src_items_per_layer,
    )
    execute(plan, block_quota, num_warps_per_block)


def transfer_kv_all_layer_mla(
    src_layers: Tensor,
    dst_layers: Tensor,
    src_indices: Tensor,
    dst_indices: Tensor,
    item_size: int,
    num_layers: int,
    block_quota: int = 2,
    num_warps_per_block: int = DEFAULT_NUM_WARPS,
    *,
    src_items_per_layer: int | None = None,
    dst_items_per_layer: int | None = None,
) -> None:
    """MLA :func:`transfer_kv_all_layer`: one pointer table per side (``*_items_per_layer``
    as there)."""
    plan = plans.all_layer(
        {"src_layers": src_layers},
        {"dst_layers": dst_layers},
        src_indices,
        dst_indices,
        item_size,
        num_layers,
        src_items_per_layer,
        dst_items_per_layer,
    )
    execute(plan, block_quota, num_warps_per_block)


def transfer_kv_all_layer_mla_lf_pf(
    src_layers: Tensor,
    dst: Tensor,
    src_indices: Tensor,
    dst_indices: Tensor,
    item_size: int,
    dst_layout_dim: int,
    num_layers: int,
    block_quota: int = 2,
    num_warps_per_block: int = DEFAULT_NUM_WARPS,
    *,
    src_items_per_layer: int | None = None,
) -> None:
    """MLA :func:`transfer_kv_all_layer_lf_pf`: ``dst`` is ``[items, layers, 1, kv_dim]``
    (``src_items_per_layer`` as there)."""
    plan = plans.all_layer_lf_pf(
        {"src_layers": src_layers},
        {"dst": dst},
        src_indices,
        dst_indices,
        item_size,
        dst_layout_dim,
        num_layers,
        src_items_per_layer,
    )
    execute(plan, block_quota, num_warps_per_block)
