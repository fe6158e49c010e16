"""Copies of whole recurrent states between a ``MambaPool`` and a host buffer of flat states.

A host state is one row of ``slot_bytes`` uint8: every state tensor in ``MambaPool.state_tensors``
order (``conv0``, ``conv1``, ..., ``temporal``), each as its layers in pool order, each layer
the ``row_bytes`` of that request's row as it lies in device memory (C order, native dtype).
So a row is ``MambaStateParams.mamba_cache_per_req`` bytes, with no padding, and
:func:`sections` says where each tensor starts.

A transfer is one copy per (slot, state tensor, layer): ``row_bytes`` contiguous bytes on both
sides. Offsets are computed once per call with numpy; on CUDA with a pinned host buffer every
copy of a state tensor goes to the copy engines in one batched call on the current stream
(:mod:`hicache.kernels.copy_engine`), otherwise one ``copy_`` each (``non_blocking``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from hicache.kernels import copy_engine
from hicache.pools.mamba_state import StateTensorInfo

Offsets = npt.NDArray[np.int64]


class StateSection(NamedTuple):
    """Where one state tensor lies in a host row: ``layers`` runs of ``row_bytes`` bytes from
    byte ``offset`` (layer ``l`` at ``offset + l * row_bytes``)."""

    name: str
    layers: int
    row_bytes: int
    offset: int

    @property
    def nbytes(self) -> int:
        return self.layers * self.row_bytes


def sections(infos: Sequence[StateTensorInfo]) -> list[StateSection]:
    """The sections of a host row for a pool's ``state_tensors``, in order and back to back."""
    out: list[StateSection] = []
    offset = 0
    for info in infos:
        out.append(StateSection(info.name, info.tensor.shape[0], info.row_bytes, offset))
        offset += out[-1].nbytes
    return out


def flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous ``tensor`` as a 1-D uint8 view."""
    return tensor.view(-1).view(torch.uint8)


def offsets(
    section: StateSection, rows_per_layer: int, device_slots: Offsets, host_rows: Offsets
) -> tuple[Offsets, Offsets]:
    """Byte offsets (device tensor, host buffer) of each copy of ``section``: layer-major,
    then slot. Device slot ``s`` of layer ``l`` is row ``l * rows_per_layer + s``; host row
    ``r`` starts at ``r * row stride`` where the stride is the row length (``host_rows`` are
    already scaled by it)."""
    layer = np.arange(section.layers, dtype=np.int64)[:, None] * section.row_bytes
    device = layer * rows_per_layer + device_slots[None] * section.row_bytes
    host = layer + host_rows[None] + section.offset
    return device.ravel(), host.ravel()


def copy_runs(
    dst: torch.Tensor,
    src: torch.Tensor,
    dst_off: Offsets,
    src_off: Offsets,
    nbytes: int,
    engine: torch.device | None,
) -> None:
    """Copy ``nbytes`` from ``src[src_off[j]:]`` to ``dst[dst_off[j]:]`` for every ``j`` (1-D
    uint8 tensors; destinations must not overlap), on ``engine``'s current stream when given,
    else one non-blocking ``copy_`` each."""
    if engine is not None:
        sizes = np.full(len(dst_off), nbytes, dtype=np.uint64)
        copy_engine.copy_batch(dst_off + dst.data_ptr(), src_off + src.data_ptr(), sizes, engine)
        return
    for d, s in zip(dst_off.tolist(), src_off.tolist(), strict=True):
        dst[d : d + nbytes].copy_(src[s : s + nbytes], non_blocking=True)


def engine_for(device: torch.device, host_pinned: bool) -> torch.device | None:
    """The CUDA device when copies can go to its copy engines (pinned host memory, a runtime
    that loads), else None."""
    usable = device.type == "cuda" and host_pinned and copy_engine.available()
    return device if usable else None
