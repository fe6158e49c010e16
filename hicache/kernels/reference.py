"""Plain-torch reference of every non-direct op, on CPU and CUDA tensors.

Each K/V buffer of each layer is seen as a strided uint8 view ``[pages, page, heads, chunk]``
(see :mod:`hicache.kernels.layouts`), so one layer of one buffer is a single vectorised gather on
the source and a single ``index_put_`` on the destination. Pointer-table entries become byte views
over the raw address, sized from ``*_items_per_layer`` when given, else from the largest index:
through ``__array_interface__`` (numpy) for a CPU table, ``__cuda_array_interface__`` for a CUDA
one. A table's addresses must therefore be reachable from the table's device.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from hicache.kernels.layouts import CopyPlan, Operand


def bytes_at(address: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A writable uint8 tensor over ``nbytes`` of raw memory at ``address`` (no copy)."""
    interface = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False), "version": 3}
    if device.type == "cuda":
        view = torch.as_tensor(SimpleNamespace(__cuda_array_interface__=interface))
    else:
        view = torch.from_numpy(np.asarray(SimpleNamespace(__array_interface__=interface)))
    assert view.data_ptr() == address, "a byte view must alias the memory, not copy it"
    return view


class _Side:
    """Strided byte views of one operand, one per (buffer, layer)."""

    def __init__(self, operand: Operand, plan: CopyPlan, indices: torch.Tensor):
        self.operand, self.heads, self.chunk = operand, plan.heads, plan.chunk
        indices = indices.to(operand.device)
        self.page_of = indices // operand.geometry.page
        self.slot_of = indices % operand.geometry.page
        if operand.is_table:
            self.addresses = [t.view(torch.int64).tolist() for t in operand.buffers]
        if operand.num_items is not None:
            self.pages = operand.num_items // operand.geometry.page
        else:  # a table of unknown size: as far as the largest (validated non-negative) index
            self.pages = int(self.page_of.max()) + 1

    def view(self, kv: int, layer: int) -> torch.Tensor:
        """``[pages, page, heads, chunk]`` uint8 view of buffer ``kv`` at loop layer ``layer``."""
        g = self.operand.geometry
        shape = (self.pages, g.page, self.heads, self.chunk)
        strides = (g.page_stride, g.slot_stride, g.head_stride, 1)
        if self.operand.is_table:
            span = sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + 1
            flat = bytes_at(self.addresses[kv][layer], span, self.operand.device)
            return flat.as_strided(shape, strides)
        flat = self.operand.buffers[kv].view(-1).view(torch.uint8)
        offset = flat.storage_offset() + (self.operand.first_layer + layer) * g.layer_stride
        return flat.as_strided(shape, strides, offset)

    def gather(self, kv: int, layer: int) -> torch.Tensor:
        return self.view(kv, layer)[self.page_of, self.slot_of]

    def scatter(self, kv: int, layer: int, rows: torch.Tensor) -> None:
        self.view(kv, layer)[self.page_of, self.slot_of] = rows.to(self.operand.device)


def run(plan: CopyPlan) -> None:
    """Copy every row of ``plan`` with torch indexing; the destination changes in place."""
    if plan.num_items == 0:
        return
    src = _Side(plan.src, plan, plan.src_indices)
    dst = _Side(plan.dst, plan, plan.dst_indices)
    for layer in range(plan.num_layers):
        for kv in range(plan.num_kv):
            dst.scatter(kv, layer, src.gather(kv, layer))
