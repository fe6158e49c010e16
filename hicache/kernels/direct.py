"""The direct ops: whole runs of consecutive slots, no kernel of our own.

Tensors are indexed by slot on dim 0 (layer_first) or are page_first_direct buffers
``[pages, layers, page_size, ...]`` where slot ``i`` of layer ``l`` is ``[i // page_size, l,
i % page_size]``. Runs are computed on the CPU (CUDA indices are copied over, one sync): a run
steps by +1 on both sides and never crosses a page of a page_first_direct side. Each run is one
copy per tensor: on CUDA (contiguous tensors, host ones pinned) all of them go to the copy
engines in one batched call (:mod:`hicache.kernels.copy_engine`); otherwise one ``copy_`` each
(``non_blocking``, so host <-> device copies queue on the current stream).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from hicache.checks import check_int
from hicache.kernels import copy_engine
from hicache.kernels import validate as check

Run = tuple[int, int, int]  # (src_start, dst_start, length)


class _Slots(NamedTuple):
    """One tensor's slots: ``layer`` None for layer_first, else a page_first_direct layer."""

    tensor: torch.Tensor
    layer: int | None = None

    def view(self, start: int, length: int) -> torch.Tensor:
        if self.layer is None:
            return self.tensor[start : start + length]
        page_size = self.tensor.shape[2]
        offset = start % page_size
        return self.tensor[start // page_size, self.layer, offset : offset + length]

    def geometry(self) -> tuple[int, int, int, int, int]:
        """(base, page, page stride, slot stride, slot bytes) in bytes: slot ``i`` starts at
        ``base + (i // page) * page_stride + (i % page) * slot_stride`` (contiguous tensors)."""
        t, elem = self.tensor, self.tensor.element_size()
        if self.layer is None:
            return t.data_ptr(), 1, t.stride(0) * elem, 0, t.stride(0) * elem
        base = t.data_ptr() + self.layer * t.stride(1) * elem
        return base, t.shape[2], t.stride(0) * elem, t.stride(2) * elem, t.stride(2) * elem


def _addresses(sides: Sequence[_Slots], starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Byte addresses of slots ``starts`` in every side (side-major), and each side's slot bytes."""
    geo = np.array([side.geometry() for side in sides], dtype=np.int64)
    base, page, page_stride, slot_stride = (geo[:, j : j + 1] for j in range(4))
    addr = base + (starts // page) * page_stride + (starts % page) * slot_stride
    return addr.astype(np.uint64).ravel(), geo[:, 4]


def _run_arrays(
    src_indices: torch.Tensor, dst_indices: torch.Tensor, src_page: int, dst_page: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src starts, dst starts, lengths) of the maximal runs; see :func:`runs`."""
    s, d = src_indices.numpy(), dst_indices.numpy()
    if not len(s):
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    cut = (s[1:] != s[:-1] + 1) | (d[1:] != d[:-1] + 1)
    for idx, page in ((s, src_page), (d, dst_page)):
        if page:
            cut |= idx[1:] % page == 0
    starts = np.concatenate([[0], np.flatnonzero(cut) + 1])
    return s[starts], d[starts], np.diff(starts, append=len(s))


def runs(
    src_indices: torch.Tensor, dst_indices: torch.Tensor, src_page: int = 0, dst_page: int = 0
) -> list[Run]:
    """Maximal runs where both index lists step by +1.

    A side with ``*_page > 0`` also starts a new run at each multiple of its page size.
    Indices are 1-D int64 CPU tensors of equal length.
    """
    arrays = _run_arrays(src_indices, dst_indices, src_page, dst_page)
    return list(zip(*(a.tolist() for a in arrays), strict=True))


def _on_copy_engine(pairs: Sequence[tuple[_Slots, _Slots]]) -> torch.device | None:
    """The CUDA device when every tensor can take part in one batched engine copy, else None."""
    tensors = [side.tensor for pair in pairs for side in pair]
    cuda = next((t.device for t in tensors if t.is_cuda), None)
    if cuda is None or not copy_engine.available() or not all(t.is_contiguous() for t in tensors):
        return None
    host = {t.untyped_storage().data_ptr(): t for t in tensors if not t.is_cuda}
    return cuda if all(t.is_pinned() for t in host.values()) else None


def _copy_runs(
    pairs: Sequence[tuple[_Slots, _Slots]],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    src_page: int = 0,
    dst_page: int = 0,
) -> None:
    """Copy every run for every (src, dst) pair of slot views."""
    s0, d0, n = _run_arrays(src_indices, dst_indices, src_page, dst_page)
    if not len(n):
        return
    device = _on_copy_engine(pairs)
    if device is not None:
        src, slot_bytes = _addresses([src for src, _ in pairs], s0)
        dst, _ = _addresses([dst for _, dst in pairs], d0)
        copy_engine.copy_batch(dst, src, np.outer(slot_bytes, n).ravel(), device)
        return
    for s, d, length in zip(s0.tolist(), d0.tolist(), n.tolist(), strict=True):
        for src, dst in pairs:
            dst.view(d, length).copy_(src.view(s, length), non_blocking=True)


def _tensors(name: str, value: object) -> list[torch.Tensor]:
    if not isinstance(value, (list, tuple)) or not value:
        raise TypeError(f"{name} must be a non-empty list of tensors")
    for j, tensor in enumerate(value):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name}[{j}] must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() == 0:
            raise ValueError(f"{name}[{j}] must have a slot dimension, got a 0-d tensor")
        check.check_device_type(f"{name}[{j}]", tensor)
    return list(value)


def _check_pair(
    src_name: str,
    src: torch.Tensor,
    src_item: Sequence[int],
    dst_name: str,
    dst: torch.Tensor,
    dst_item: Sequence[int],
) -> None:
    """Same dtype, and the same shape for one slot on both sides."""
    if src.dtype != dst.dtype or tuple(src_item) != tuple(dst_item):
        raise ValueError(
            f"{src_name} ({src.dtype}, slot shape {tuple(src_item)}) and {dst_name} "
            f"({dst.dtype}, slot shape {tuple(dst_item)}) must match"
        )


def _check_paged(name: str, tensor: torch.Tensor, page_size: int) -> None:
    """A page_first_direct buffer ``[pages, layers, page_size, ...]``."""
    if tensor.dim() < 3 or tensor.shape[2] != page_size:
        raise ValueError(
            f"{name} must be [pages, layers, page_size={page_size}, ...], "
            f"got shape {tuple(tensor.shape)}"
        )


def _cpu_indices(
    src_indices: object, dst_indices: object, page: int, src_limit: int, dst_limit: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked CPU copies of both index tensors (``page`` is a checked page size)."""
    n = check.check_indices(src_indices, dst_indices)
    if n % page:
        raise ValueError(f"len(src_indices) ({n}) must be a multiple of page_size ({page})")
    assert isinstance(src_indices, torch.Tensor) and isinstance(dst_indices, torch.Tensor)
    s, d = src_indices.cpu(), dst_indices.cpu()
    check.check_index_range("src_indices", s, src_limit)
    check.check_index_range("dst_indices", d, dst_limit)
    return s, d


def transfer_kv_direct(
    src_layers: list[torch.Tensor],
    dst_layers: list[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    page_size: int,
) -> None:
    """``dst_layers[j][dst_indices] = src_layers[j][src_indices]`` for every ``j``.

    Parameters
    ----------
    src_layers, dst_layers : equally long lists of tensors ``[slots, ...]`` (any device), pairwise
        of one dtype and slot shape.
    src_indices, dst_indices : int64 ``[n]`` slot indices, ``n % page_size == 0``, any device.
    page_size : int >= 1.
    """
    srcs, dsts = _tensors("src_layers", src_layers), _tensors("dst_layers", dst_layers)
    if len(srcs) != len(dsts):
        raise ValueError(f"src_layers and dst_layers differ in length: {len(srcs)} != {len(dsts)}")
    for j, (src, dst) in enumerate(zip(srcs, dsts, strict=True)):
        _check_pair(f"src_layers[{j}]", src, src.shape[1:], f"dst_layers[{j}]", dst, dst.shape[1:])
    page = check_int("page_size", page_size, minimum=1)
    s, d = _cpu_indices(
        src_indices, dst_indices, page, min(t.shape[0] for t in srcs), min(t.shape[0] for t in dsts)
    )
    _copy_runs([(_Slots(src), _Slots(dst)) for src, dst in zip(srcs, dsts, strict=True)], s, d)


def transfer_kv_per_layer_direct_pf_lf(
    src_ptrs: list[torch.Tensor],
    dst_ptrs: list[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    layer_id: int,
    page_size: int,
) -> None:
    """Layer ``layer_id`` of page_first_direct buffers into layer_first buffers.

    Parameters
    ----------
    src_ptrs : ``[host_k, host_v]`` (MLA ``[host_kv]``), each ``[pages, layers, page_size, ...]``.
    dst_ptrs : ``[k_layer, v_layer]`` (MLA ``[kv_layer]``), each ``[slots, ...]``.
    src_indices, dst_indices : int64 ``[n]`` slot indices, ``n % page_size == 0``, any device.
    layer_id : int in ``[0, layers)``.
    page_size : int >= 1, the page dimension of ``src_ptrs``.
    """
    srcs, dsts = _tensors("src_ptrs", src_ptrs), _tensors("dst_ptrs", dst_ptrs)
    if len(srcs) != len(dsts):
        raise ValueError(f"src_ptrs and dst_ptrs differ in length: {len(srcs)} != {len(dsts)}")
    page = check_int("page_size", page_size, minimum=1)
    for j, (src, dst) in enumerate(zip(srcs, dsts, strict=True)):
        _check_paged(f"src_ptrs[{j}]", src, page)
        _check_pair(f"src_ptrs[{j}]", src, src.shape[3:], f"dst_ptrs[{j}]", dst, dst.shape[1:])
        check.check_layer_id(layer_id, src.shape[1])
    s, d = _cpu_indices(
        src_indices,
        dst_indices,
        page,
        min(t.shape[0] * page for t in srcs),
        min(t.shape[0] for t in dsts),
    )
    pairs = [(_Slots(src, layer_id), _Slots(dst)) for src, dst in zip(srcs, dsts, strict=True)]
    _copy_runs(pairs, s, d, src_page=page)


def transfer_kv_all_layer_direct_lf_pf(
    src_ptrs: list[torch.Tensor],
    dst_ptrs: list[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Every layer of layer_first buffers into page_first_direct buffers.

    Parameters
    ----------
    src_ptrs : ``k_layers + v_layers`` (MLA ``kv_layers``): ``len(dst_ptrs) * layers`` tensors
        ``[slots, ...]``; ``src_ptrs[j * layers + l]`` is layer ``l`` of ``dst_ptrs[j]``.
    dst_ptrs : ``[host_k, host_v]`` (MLA ``[host_kv]``), each ``[pages, layers, page_size, ...]``.
    src_indices, dst_indices : int64 ``[n]`` slot indices, ``n % page_size == 0``, any device.
    page_size : int >= 1, the page dimension of ``dst_ptrs``.
    """
    srcs, dsts = _tensors("src_ptrs", src_ptrs), _tensors("dst_ptrs", dst_ptrs)
    page = check_int("page_size", page_size, minimum=1)
    for j, dst in enumerate(dsts):
        _check_paged(f"dst_ptrs[{j}]", dst, page)
        if dst.shape != dsts[0].shape:
            raise ValueError(
                f"dst_ptrs[{j}] has shape {tuple(dst.shape)}, dst_ptrs[0] "
                f"{tuple(dsts[0].shape)}; they must match"
            )
    layers = dsts[0].shape[1]
    if len(srcs) != layers * len(dsts):
        raise ValueError(
            f"src_ptrs must hold len(dst_ptrs) * layers = {layers * len(dsts)} "
            f"tensors, got {len(srcs)}"
        )
    for k, src in enumerate(srcs):
        dst = dsts[k // layers]
        _check_pair(
            f"src_ptrs[{k}]", src, src.shape[1:], f"dst_ptrs[{k // layers}]", dst, dst.shape[3:]
        )
    s, d = _cpu_indices(
        src_indices,
        dst_indices,
        page,
        min(t.shape[0] for t in srcs),
        min(t.shape[0] * page for t in dsts),
    )
    pairs = [(_Slots(src), _Slots(dsts[k // layers], k % layers)) for k, src in enumerate(srcs)]
    _copy_runs(pairs, s, d, dst_page=page)
