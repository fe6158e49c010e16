"""The kernel transfer ops: validate, then run (Triton on CUDA, torch reference on the CPU).

This module holds the five per-layer ops and the contract of all ten; the five all-layer ops
are in :mod:`hicache.kernels.all_layer_ops`, the plan-once form of the per-layer ops in
:mod:`hicache.kernels.layer_plan`.

Shared contract (every op)
--------------------------
- Bytes move, dtypes do not matter: ``item_size`` is the bytes of one token in one layer
  (``head_num * head_dim * elem_size`` for MHA, ``kv_dim * elem_size`` for MLA), a multiple of 8.
- ``src_indices`` / ``dst_indices``: 1-D int64 item indices of equal length, on the CPU or on the
  CUDA device of the copy (CPU ones are copied over; keep them on the device to avoid that copy).
  Item ``src_indices[j]`` of the source lands on item ``dst_indices[j]`` of the destination.
- Data tensors are contiguous with dim 0 indexing items (pages for page_head), all of one dtype;
  K and V of a side share dtype, shape and device.
- ``*_layers`` arguments are uint64 pointer tables (``num_layers`` ``data_ptr()`` values, 8-byte
  aligned) on the device that runs the copy: the CUDA device when any buffer is on CUDA.
  A table cannot tell how large the buffers behind its addresses are, so the all-layer ops take
  ``src_items_per_layer`` / ``dst_items_per_layer`` (keyword-only, int >= 1): every address must
  start a buffer of at least that many ``item_size`` items, and indices of that side must then
  lie in ``[0, items_per_layer)`` (checked like a tensor side's). The pools always pass them.
  Left as None, only negative indices are rejected on that side: an index past the end of a
  layer is unchecked and reaches whatever memory follows it (the caller's responsibility).
- With any CUDA buffer the copy is one Triton launch on the current stream (asynchronous); host
  buffers must then be pinned. Otherwise it runs synchronously with torch on the CPU.
- ``block_quota``: at most this many thread blocks (a persistent grid), so the copy leaves the GPU
  to compute. ``num_warps_per_block``: Triton ``num_warps`` of each block, a power of two.
- The destination changes in place; nothing is returned. Bad arguments raise ``TypeError``,
  ``ValueError`` or ``IndexError`` (out-of-range index or layer id) before anything is written.
"""

from __future__ import annotations

import torch

from hicache.kernels import plans
from hicache.kernels.dispatch import execute

DEFAULT_NUM_WARPS = 16 if torch.version.hip else 32
Tensor = torch.Tensor


def transfer_kv_per_layer(
    src_k: Tensor,
    dst_k: Tensor,
    src_v: Tensor,
    dst_v: Tensor,
    src_indices: Tensor,
    dst_indices: Tensor,
    item_size: int,
    block_quota: int = 2,
    num_warps_per_block: int = DEFAULT_NUM_WARPS,
) -> None:
    """One layer, layer_first to layer_first.

    Parameters
    ----------
    src_k, src_v : ``[src_items, ...]``, item ``i`` at byte ``i * item_size``.
    dst_k, dst_v : ``[dst_items, ...]`` likewise.
    src_indices, dst_indices, item_size, block_quota, num_warps_per_block : see the module.
    """
    plan = plans.per_layer(
        {"src_k": src_k, "src_v": src_v},
        {"dst_k": dst_k, "dst_v": dst_v},
        src_indices,
        dst_indices,
        item_size,
    )
    execute(plan, block_quota, num_warps_per_block)


def transfer_kv_per_layer_pf_lf(
    src_k: Tensor,
    dst_k: Tensor,
    src_v: Tensor,
    dst_v: Tensor,
    src_indices: Tensor,
    dst_indices: Tensor,
    layer_id: int,
    item_size: int,
    src_layout_dim: int,
    block_quota: int = 2,
    num_warps_per_block: int = DEFAULT_NUM_WARPS,
) -> None:
    """Layer ``layer_id`` of a page_first source into one layer_first layer.

    Parameters
    ----------
    src_k, src_v : ``[src_items, layers, ...]``, item ``i`` of layer ``l`` at byte
        ``i * src_layout_dim + l * item_size``.
    dst_k, dst_v : ``[dst_items, ...]`` layer_first.
    layer_id : int in ``[0, src_layout_dim / item_size)``.
    src_layout_dim : bytes of one item over all layers, ``layers * item_size``.
    src_indices, dst_indices, item_size, block_quota, num_warps_per_block : see the module.
    """
    plan = plans.per_layer_pf_lf(
        {"src_k": src_k, "src_v": src_v},
        {"dst_k": dst_k, "dst_v": dst_v},
        src_indices,
        dst_indices,
        layer_id,
        item_size,
        src_layout_dim,
    )
    execute(plan, block_quota, num_warps_per_block)


def transfer_kv_per_layer_ph_lf(
    src_k: Tensor,
    dst_k: Tensor,
    src_v: Tensor,
    dst_v: Tensor,
    src_indices: Tensor,
    dst_indices: Tensor,
    layer_id: int,
    item_size: int,
    src_layout_dim: int,
    page_size: int,
    head_num: int,
    block_quota: int = 2,
    num_warps_per_block: int = DEFAULT_NUM_WARPS,
) -> None:
    """Layer ``layer_id`` of a page_head source into one layer_first layer.

    Parameters
    ----------
    src_k, src_v : ``[pages, head_num, page_size, layers, head_dim]``; head ``h`` of item ``i``
        (``item_size / head_num`` bytes) at ``(i // page_size) * page_size * src_layout_dim
        + h * page_size * src_layout_dim / head_num + (i % page_size) * src_layout_dim / head_num
        + layer_id * item_size / head_num``.
    dst_k, dst_v : ``[dst_items, head_num, head_dim]`` layer_first.
    layer_id, src_layout_dim : as in :func:`transfer_kv_per_layer_pf_lf`.
    page_size, head_num : ints >= 1; ``head_num`` divides ``item_size``.
    src_indices, dst_indices, item_size, block_quota, num_warps_per_block : see the module.
    """
    plan = plans.per_layer_ph_lf(
        {"src_k": src_k, "src_v": src_v},
        {"dst_k": dst_k, "dst_v": dst_v},
        src_indices,
        dst_indices,
        layer_id,
        item_size,
        src_layout_dim,
        page_size,
        head_num,
    )
    execute(plan, block_quota, num_warps_per_block)


def transfer_kv_per_layer_mla(
    src: Tensor,
    dst: Tensor,
    src_indices: Tensor,
    dst_indices: Tensor,
    item_size: int,
    block_quota: int = 2,
    num_warps_per_block: int = DEFAULT_NUM_WARPS,
) -> None:
    """MLA :func:`transfer_kv_per_layer`: one latent buffer ``[items, 1, kv_dim]`` per side."""
    plan = plans.per_layer({"src": src}, {"dst": dst}, src_indices, dst_indices, item_size)
    execute(plan, block_quota, num_warps_per_block)


def transfer_kv_per_layer_mla_pf_lf(
    src: Tensor,
    dst: Tensor,
    src_indices: Tensor,
    dst_indices: Tensor,
    layer_id: int,
    item_size: int,
    src_layout_dim: int,
    block_quota: int = 2,
    num_warps_per_block: int = DEFAULT_NUM_WARPS,
) -> None:
    """MLA :func:`transfer_kv_per_layer_pf_lf`: ``src`` is ``[items, layers, 1, kv_dim]``."""
    plan = plans.per_layer_pf_lf(
        {"src": src}, {"dst": dst}, src_indices, dst_indices, layer_id, item_size, src_layout_dim
    )
    execute(plan, block_quota, num_warps_per_block)
