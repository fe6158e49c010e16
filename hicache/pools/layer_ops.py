"""Calls from the host pools into :mod:`hicache.kernels`, one set of functions per route.

``load(host, dev, host_idx, dev_idx, layer_id)`` copies one layer host -> device;
``backup(host, dev, host_idx, dev_idx, block_quota)`` copies every layer device -> host (the
plan-once load of every layer is :mod:`hicache.pools.load_plan`). ``host`` is a
:class:`HostBuffers` (a host pool, or a staging buffer: :mod:`hicache.pools.backup_staging`),
``dev`` the matching device pool. Indices are already where the op wants them (the kernel's
device, or the CPU for direct ops). Every all-layer op gets the item count behind each of its
pointer tables (``*_items_per_layer``), so it bounds indices. The routes (load / backup):

- kernel, layer_first: ``transfer_kv_per_layer`` / ``transfer_kv_all_layer``
- kernel, page_first: ``transfer_kv_per_layer_pf_lf`` / ``transfer_kv_all_layer_lf_pf``
- kernel, page_head (MHA): ``transfer_kv_per_layer_ph_lf`` / ``transfer_kv_all_layer_lf_ph``
- direct, layer_first: ``transfer_kv_direct`` both ways
- direct, page_first_direct: ``transfer_kv_per_layer_direct_pf_lf`` /
  ``transfer_kv_all_layer_direct_lf_pf``

``_mla`` variants serve MLA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch

from hicache import kernels
from hicache.pools.device_pool import KVPool

Tensor = torch.Tensor


class HostBuffers(Protocol):
    """What the routes read of a host pool (``HostKVPool``)."""

    layout: str
    size: int
    page_size: int
    layer_num: int
    item_size: int
    layout_dim: int
    head_num: int
    host_parts: list[Tensor]  # the K/V (or latent) buffers
    host_ptr_tables: list[Tensor] | None  # per-part layer tables (layer_first only)
    closed: bool


BLOCK_QUOTA = 2  # programs of a serving backup: the SMs it takes from the model


class LayerOps(NamedTuple):
    load: Callable[[HostBuffers, KVPool, Tensor, Tensor, int], None]
    backup: Callable[[HostBuffers, KVPool, Tensor, Tensor, int], None]


def _tables(host: HostBuffers) -> list[Tensor]:
    assert host.host_ptr_tables is not None, "a layer_first host pool has pointer tables"
    return host.host_ptr_tables


def direct_load(host: HostBuffers, dev: KVPool, h: Tensor, d: Tensor, layer: int) -> None:
    dst = [part[layer] for part in dev.part_buffers]
    if host.layout == "layer_first":
        src = [part[layer] for part in host.host_parts]
        kernels.transfer_kv_direct(src, dst, h, d, host.page_size)
    else:
        kernels.transfer_kv_per_layer_direct_pf_lf(
            host.host_parts, dst, h, d, layer, host.page_size
        )


def direct_backup(host: HostBuffers, dev: KVPool, h: Tensor, d: Tensor) -> None:
    src = [layer for part in dev.part_buffers for layer in part]
    if host.layout == "layer_first":
        dst = [layer for part in host.host_parts for layer in part]
        kernels.transfer_kv_direct(src, dst, d, h, host.page_size)
    else:
        kernels.transfer_kv_all_layer_direct_lf_pf(src, host.host_parts, d, h, host.page_size)


# -- MHA --------------------------------------------------------------------------------------


def _mha_load_lf(host: HostBuffers, dev: KVPool, h: Tensor, d: Tensor, layer: int) -> None:
    dk, dv = dev.part_buffers
    hk, hv = host.host_parts
    kernels.transfer_kv_per_layer(hk[layer], dk[layer], hv[layer], dv[layer], h, d, host.item_size)


def _mha_backup_lf(host: HostBuffers, dev: KVPool, h: Tensor, d: Tensor, quota: int) -> None:
    dk_ptrs, dv_ptrs = dev.part_data_ptrs
    hk_ptrs, hv_ptrs = _tables(host)
    kernels.transfer_kv_all_layer(
        dk_ptrs,
        hk_ptrs,
        dv_ptrs,
        hv_ptrs,
        d,
        h,
        host.item_size,
        host.layer_num,
        quota,
        src_items_per_layer=dev.num_slots,
        dst_items_per_layer=host.size,
    )


def _mha_load_pf(host: HostBuffers, dev: KVPool, h: Tensor, d: Tensor, layer: int) -> None:
    dk, dv = dev.part_buffers
    hk, hv = host.host_parts
    kernels.transfer_kv_per_layer_pf_lf(
        hk, dk[layer], hv, dv[layer], h, d, layer,
        host.item_size, host.layout_dim,
    )  # fmt: skip


def _mha_backup_pf(host: HostBuffers, dev: KVPool, h: Tensor, d: Tensor, quota: int) -> None:
    dk_ptrs, dv_ptrs = dev.part_data_ptrs
    hk, hv = host.host_parts
    kernels.transfer_kv_all_layer_lf_pf(
        dk_ptrs, hk, dv_ptrs, hv, d, h,
        host.item_size, host.layout_dim, host.layer_num, quota, src_items_per_layer=dev.num_slots,
    )  # fmt: skip


def _mha_load_ph(host: HostBuffers, dev: KVPool, h: Tensor, d: Tensor, layer: int) -> None:
    dk, dv = dev.part_buffers
    hk, hv = host.host_parts
    kernels.transfer_kv_per_layer_ph_lf(
        hk, dk[layer], hv, dv[layer], h, d, layer,
        host.item_size, host.layout_dim, host.page_size, host.head_num,
    )  # fmt: skip


def _mha_backup_ph(host: HostBuffers, dev: KVPool, h: Tensor, d: Tensor, quota: int) -> None:
    dk_ptrs, dv_ptrs = dev.part_data_ptrs
    hk, hv = host.host_parts
    kernels.transfer_kv_all_layer_lf_ph(
        dk_ptrs, hk, dv_ptrs, hv, d, h,
        host.item_size, host.layout_dim, host.layer_num, host.page_size, host.head_num, quota,
        src_items_per_layer=dev.num_slots,
    )  # fmt: skip


# -- MLA --------------------------------------------------------------------------------------


def _mla_load_lf(host: HostBuffers, dev: KVPool, h: Tensor, d: Tensor, layer: int) -> None:
    (dkv,) = dev.part_buffers
    (hkv,) = host.host_parts
    kernels.transfer_kv_per_layer_mla(hkv[layer], dkv[layer], h, d, host.item_size)


def _mla_backup_lf(host: HostBuffers, dev: KVPool, h: Tensor, d: Tensor, quota: int) -> None:
    (dkv_ptrs,) = dev.part_data_ptrs
    (h_ptrs,) = _tables(host)
    kernels.transfer_kv_all_layer_mla(
        dkv_ptrs,
        h_ptrs,
        d,
        h,
        host.item_size,
        host.layer_num,
        quota,
        src_items_per_layer=dev.num_slots,
        dst_items_per_layer=host.size,
    )


def _mla_load_pf(host: HostBuffers, dev: KVPool, h: Tensor, d: Tensor, layer: int) -> None:
    (dkv,) = dev.part_buffers
    (hkv,) = host.host_parts
    kernels.transfer_kv_per_layer_mla_pf_lf(
        hkv, dkv[layer], h, d, layer, host.item_size, host.layout_dim
    )


def _mla_backup_pf(host: HostBuffers, dev: KVPool, h: Tensor, d: Tensor, quota: int) -> None:
    (dkv_ptrs,) = dev.part_data_ptrs
    (hkv,) = host.host_parts
    kernels.transfer_kv_all_layer_mla_lf_pf(
        dkv_ptrs,
        hkv,
        d,
        h,
        host.item_size,
        host.layout_dim,
        host.layer_num,
        quota,
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
