"""Calls from the host pools into :mod:`hicache.kernels`, one pair of functions per route.

``load(host, dev, host_idx, dev_idx, layer_id)`` copies one layer host -> device;
``backup(host, dev, host_idx, dev_idx)`` copies every layer device -> host. ``host`` is a
``HostKVPool`` (``host_parts``: its K/V or latent buffers; ``host_ptr_tables``: per-part layer
pointer tables for ``layer_first``), ``dev`` the matching device pool. Indices are already where
the op wants them (the kernel's device, or the CPU for direct ops). Every all-layer op gets the
item count behind each of its pointer tables (``*_items_per_layer``), so it bounds indices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from hicache import kernels

Tensor = torch.Tensor


class LayerOps(NamedTuple):
    load: Callable[[Any, Any, Tensor, Tensor, int], None]
    backup: Callable[[Any, Any, Tensor, Tensor], None]


def direct_load(host: Any, dev: Any, h: Tensor, d: Tensor, layer: int) -> None:
    dst = [part[layer] for part in dev.part_buffers]
    if host.layout == "layer_first":
        src = [part[layer] for part in host.host_parts]
        kernels.transfer_kv_direct(src, dst, h, d, host.page_size)
    else:
        kernels.transfer_kv_per_layer_direct_pf_lf(
            host.host_parts, dst, h, d, layer, host.page_size
        )


def direct_backup(host: Any, dev: Any, h: Tensor, d: Tensor) -> None:
    src = [layer for part in dev.part_buffers for layer in part]
    if host.layout == "layer_first":
        dst = [layer for part in host.host_parts for layer in part]
        kernels.transfer_kv_direct(src, dst, d, h, host.page_size)
    else:
        kernels.transfer_kv_all_layer_direct_lf_pf(src, host.host_parts, d, h, host.page_size)


# -- MHA --------------------------------------------------------------------------------------


def _mha_load_lf(host: Any, dev: Any, h: Tensor, d: Tensor, layer: int) -> None:
    hk, hv = host.host_parts
    kernels.transfer_kv_per_layer(
        hk[layer], dev.k_buffer[layer], hv[layer], dev.v_buffer[layer], h, d, host.item_size
    )


def _mha_backup_lf(host: Any, dev: Any, h: Tensor, d: Tensor) -> None:
    hk_ptrs, hv_ptrs = host.host_ptr_tables
    kernels.transfer_kv_all_layer(
        dev.k_data_ptrs,
        hk_ptrs,
        dev.v_data_ptrs,
        hv_ptrs,
        d,
        h,
        host.item_size,
        host.layer_num,
        src_items_per_layer=dev.num_slots,
        dst_items_per_layer=host.size,
    )


def _mha_load_pf(host: Any, dev: Any, h: Tensor, d: Tensor, layer: int) -> None:
    hk, hv = host.host_parts
    kernels.transfer_kv_per_layer_pf_lf(
        hk, dev.k_buffer[layer], hv, dev.v_buffer[layer], h, d, layer,
        host.item_size, host.layout_dim,
    )  # fmt: skip


def _mha_backup_pf(host: Any, dev: Any, h: Tensor, d: Tensor) -> None:
    hk, hv = host.host_parts
    kernels.transfer_kv_all_layer_lf_pf(
        dev.k_data_ptrs, hk, dev.v_data_ptrs, hv, d, h,
        host.item_size, host.layout_dim, host.layer_num, src_items_per_layer=dev.num_slots,
    )  # fmt: skip


def _mha_load_ph(host: Any, dev: Any, h: Tensor, d: Tensor, layer: int) -> None:
    hk, hv = host.host_parts
    kernels.transfer_kv_per_layer_ph_lf(
        hk, dev.k_buffer[layer], hv, dev.v_buffer[layer], h, d, layer,
        host.item_size, host.layout_dim, host.page_size, host.head_num,
    )  # fmt: skip


def _mha_backup_ph(host: Any, dev: Any, h: Tensor, d: Tensor) -> None:
    hk, hv = host.host_parts
    kernels.transfer_kv_all_layer_lf_ph(
        dev.k_data_ptrs, hk, dev.v_data_ptrs, hv, d, h,
        host.item_size, host.layout_dim, host.layer_num, host.page_size, host.head_num,
        src_items_per_layer=dev.num_slots,
    )  # fmt: skip


# -- MLA --------------------------------------------------------------------------------------


def _mla_load_lf(host: Any, dev: Any, h: Tensor, d: Tensor, layer: int) -> None:
    (hkv,) = host.host_parts
    kernels.transfer_kv_per_layer_mla(hkv[layer], dev.kv_buffer[layer], h, d, host.item_size)


def _mla_backup_lf(host: Any, dev: Any, h: Tensor, d: Tensor) -> None:
    (h_ptrs,) = host.host_ptr_tables
    kernels.transfer_kv_all_layer_mla(
        dev.kv_data_ptrs,
        h_ptrs,
        d,
        h,
        host.item_size,
        host.layer_num,
        src_items_per_layer=dev.num_slots,
        dst_items_per_layer=host.size,
    )


def _mla_load_pf(host: Any, dev: Any, h: Tensor, d: Tensor, layer: int) -> None:
    (hkv,) = host.host_parts
    kernels.transfer_kv_per_layer_mla_pf_lf(
        hkv, dev.kv_buffer[layer], h, d, layer, host.item_size, host.layout_dim
    )


def _mla_backup_pf(host: Any, dev: Any, h: Tensor, d: Tensor) -> None:
    (hkv,) = host.host_parts
    kernels.transfer_kv_all_layer_mla_lf_pf(
        dev.kv_data_ptrs,
        hkv,
        d,
        h,
        host.item_size,
        host.layout_dim,
        host.layer_num,
        src_items_per_layer=dev.num_slots,
    )


# (parts, layout) -> kernel route; parts is 2 for MHA (K and V), 1 for MLA.
KERNEL_OPS: dict[tuple[int, str], LayerOps] = {
    (2, "layer_first"): LayerOps(_mha_load_lf, _mha_backup_lf),
    (2, "page_first"): LayerOps(_mha_load_pf, _mha_backup_pf),
    (2, "page_head"): LayerOps(_mha_load_ph, _mha_backup_ph),
    (1, "layer_first"): LayerOps(_mla_load_lf, _mla_backup_lf),
    (1, "page_first"): LayerOps(_mla_load_pf, _mla_backup_pf),
}
