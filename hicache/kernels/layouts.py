"""Where an item lives: the byte geometry of each KV layout, and the plan of one transfer.

Every non-direct op copies, for each layer ``l``, each item pair ``(s, d)`` and each head ``h``,
one *row* of ``chunk = item_size / heads`` bytes from the source to the destination. One formula
covers every layout (all values in bytes)::

    offset(i, h, l) = base(l) + (i // page) * page_stride + (i % page) * slot_stride
                    + h * head_stride

with ``base(l) = table[l]`` for a pointer table and ``data_ptr + (first_layer + l) * layer_stride``
for a tensor. The torch reference and the Triton kernels both read this one description.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Geometry:
    """Byte strides of one layout; see the module docstring for the offset formula."""

    page: int
    page_stride: int
    slot_stride: int
    head_stride: int
    layer_stride: int

    @property
    def strides(self) -> tuple[int, ...]:
        return (self.page_stride, self.slot_stride, self.head_stride, self.layer_stride)


def layer_first(item_size: int, heads: int = 1) -> Geometry:
    """One layer's buffer, item ``i`` at ``i * item_size`` (a tensor or each table entry)."""
    return Geometry(1, item_size, 0, item_size // heads, 0)


def page_first(item_size: int, layout_dim: int, heads: int = 1) -> Geometry:
    """``[items, layers, ...]``: item ``i`` of layer ``l`` at ``i * layout_dim + l * item_size``."""
    return Geometry(1, layout_dim, 0, item_size // heads, item_size)


def page_head(item_size: int, layout_dim: int, page_size: int, heads: int) -> Geometry:
    """``[pages, heads, page_size, layers, head_dim]``; each head's slice is ``item_size / heads``.

    Item ``i``, head ``h``, layer ``l`` at ``(i // page_size) * page_size * layout_dim
    + h * page_size * layout_dim / heads + (i % page_size) * layout_dim / heads
    + l * item_size / heads``.
    """
    per_head = layout_dim // heads
    return Geometry(
        page_size, page_size * layout_dim, per_head, page_size * per_head, item_size // heads
    )


@dataclass(frozen=True)
class Operand:
    """One side of a transfer: its K (and V) buffers and their geometry.

    ``buffers`` are contiguous data tensors, or (``is_table``) uint64 pointer tables with one
    address per layer. ``num_items`` bounds the item index (``None`` for a table whose caller did
    not give ``*_items_per_layer``: the buffers behind the addresses are then unknown).
    ``first_layer`` is the layer walked first (``layer_id`` of the per-layer ops).
    """

    names: tuple[str, ...]
    buffers: tuple[torch.Tensor, ...]
    is_table: bool
    geometry: Geometry
    num_items: int | None
    first_layer: int = 0

    @property
    def device(self) -> torch.device:
        return self.buffers[0].device

    def named(self) -> list[tuple[str, torch.Tensor]]:
        return list(zip(self.names, self.buffers, strict=True))

    def base(self, kv: int) -> int:
        """Address of layer ``first_layer`` of buffer ``kv`` (tensor operands only)."""
        assert not self.is_table, "a pointer table has no single base address"
        return self.buffers[kv].data_ptr() + self.first_layer * self.geometry.layer_stride


@dataclass(frozen=True)
class CopyPlan:
    """A validated transfer: rows of ``chunk`` bytes for ``num_layers`` layers and each K/V.

    ``src_indices`` / ``dst_indices`` are 1-D int64 item indices of equal length on any device;
    the backends move them where they need them.
    """

    src: Operand
    dst: Operand
    src_indices: torch.Tensor
    dst_indices: torch.Tensor
    num_layers: int
    heads: int
    chunk: int
    device: torch.device

    @property
    def num_kv(self) -> int:
        return len(self.src.buffers)

    @property
    def num_items(self) -> int:
        return self.src_indices.numel()
