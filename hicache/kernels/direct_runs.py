"""Runs of consecutive slots and how the direct ops copy them (no validation here).

A run steps by +1 on both sides and never crosses a page of a page_first_direct side; each run is
one copy per tensor pair. On CUDA (contiguous tensors, host ones pinned) every copy of a call goes
to the copy engines in one batched call (:mod:`hicache.kernels.copy_engine`); otherwise one
``copy_`` each (``non_blocking``, so host <-> device copies queue on the current stream).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from hicache.kernels import copy_engine

Run = tuple[int, int, int]  # (src_start, dst_start, length)
Int64Array = npt.NDArray[np.int64]
EngineBatch = tuple[np.ndarray, np.ndarray, np.ndarray]  # dst addresses, src addresses, nbytes


class Slots(NamedTuple):
    """One tensor's slots: ``layer`` None for layer_first ``[slots, ...]``, else layer ``layer``
    of a page_first_direct buffer ``[pages, layers, page_size, ...]``."""

    tensor: torch.Tensor
    layer: int | None = None

    def view(self, start: int, length: int) -> torch.Tensor:
        if self.layer is None:
            return self.tensor[start : start + length]
        page_size = self.tensor.shape[2]
        offset = start % page_size
        return self.tensor[start // page_size, self.layer, offset : offset + length]

    def base(self) -> int:
        """Address of slot 0 (of ``layer``)."""
        t = self.tensor
        return t.data_ptr() + (
            0 if self.layer is None else self.layer * t.stride(1) * t.element_size()
        )

    def geometry(self) -> tuple[int, int, int, int, int]:
        """(base, page, page stride, slot stride, slot bytes) in bytes: slot ``i`` starts at
        ``base + (i // page) * page_stride + (i % page) * slot_stride`` (contiguous tensors)."""
        t, elem = self.tensor, self.tensor.element_size()
        if self.layer is None:
            return self.base(), 1, t.stride(0) * elem, 0, t.stride(0) * elem
        return self.base(), t.shape[2], t.stride(0) * elem, t.stride(2) * elem, t.stride(2) * elem


Pairs = Sequence[tuple[Slots, Slots]]


def _offsets(sides: Sequence[Slots], starts: Int64Array) -> tuple[Int64Array, Int64Array]:
    """``[sides, runs]`` byte offsets of slots ``starts`` from each side's base, and each side's
    slot bytes."""
    geo = np.array([side.geometry()[1:] for side in sides], dtype=np.int64)
    page, page_stride, slot_stride = (geo[:, j : j + 1] for j in range(3))
    return (starts // page) * page_stride + (starts % page) * slot_stride, geo[:, 3]


def _addresses(layers: Sequence[Sequence[Slots]], offsets: Int64Array) -> np.ndarray:
    """``[layers, sides * runs]`` uint64 addresses: each layer's side bases plus ``offsets``
    (every layer's sides laid out like the first layer's)."""
    bases = np.array([[side.base() for side in sides] for sides in layers], dtype=np.int64)
    addr = bases[:, :, None] + offsets[None]
    return addr.astype(np.uint64).reshape(len(layers), -1)


def engine_device(pairs: Pairs) -> torch.device | None:
    """The CUDA device when every tensor can take part in one batched engine copy, else None."""
    tensors = [side.tensor for pair in pairs for side in pair]
    cuda = next((t.device for t in tensors if t.is_cuda), None)
    if cuda is None or not copy_engine.available() or not all(t.is_contiguous() for t in tensors):
        return None
    host = {t.untyped_storage().data_ptr(): t for t in tensors if not t.is_cuda}
    return cuda if all(t.is_pinned() for t in host.values()) else None


@dataclass(frozen=True)
class Runs:
    """The maximal runs of one (src, dst) index pair: start slots on each side, lengths."""

    src: Int64Array
    dst: Int64Array
    lengths: Int64Array

    @classmethod
    def of(
        cls, src_indices: torch.Tensor, dst_indices: torch.Tensor, src_page: int, dst_page: int
    ) -> Runs:
        """Runs of 1-D int64 CPU indices of equal length; a side with ``*_page > 0`` also starts
        a new run at each multiple of its page size."""
        s, d = src_indices.numpy(), dst_indices.numpy()
        if not len(s):
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty, empty)
        cut = (s[1:] != s[:-1] + 1) | (d[1:] != d[:-1] + 1)
        for idx, page in ((s, src_page), (d, dst_page)):
            if page:
                cut |= idx[1:] % page == 0
        starts = np.concatenate([[0], np.flatnonzero(cut) + 1])
        return cls(s[starts], d[starts], np.diff(starts, append=len(s)))

    def as_list(self) -> list[Run]:
        arrays = (self.src.tolist(), self.dst.tolist(), self.lengths.tolist())
        return list(zip(*arrays, strict=True))

    def engine_batches(self, layer_pairs: Sequence[Pairs]) -> list[EngineBatch]:
        """The (dst, src, nbytes) arrays of one batched engine copy of every run for every
        pair, for each entry of ``layer_pairs`` (layers laid out alike, bases apart), computed
        together."""
        src_off, slot_bytes = _offsets([src for src, _ in layer_pairs[0]], self.src)
        dst_off, _ = _offsets([dst for _, dst in layer_pairs[0]], self.dst)
        nbytes = np.outer(slot_bytes, self.lengths).astype(np.uint64).ravel()
        src = _addresses([[s for s, _ in pairs] for pairs in layer_pairs], src_off)
        dst = _addresses([[d for _, d in pairs] for pairs in layer_pairs], dst_off)
        return [(dst[j], src[j], nbytes) for j in range(len(layer_pairs))]

    def copy(self, pairs: Pairs, engine: torch.device | None) -> None:
        """Copy every run for every (src, dst) pair; ``engine`` is ``engine_device(pairs)``."""
        if not len(self.lengths):
            return
        if engine is not None:
            copy_engine.copy_batch(*self.engine_batches([pairs])[0], engine)
            return
        for s, d, length in self.as_list():
            for src_slots, dst_slots in pairs:
                dst_slots.view(d, length).copy_(src_slots.view(s, length), non_blocking=True)
