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

import torch

from hicache.checks import check_int
from hicache.kernels import validate as check
from hicache.kernels.direct_runs import Pairs, Run, Runs, Slots, engine_device


def runs(
    src_indices: torch.Tensor, dst_indices: torch.Tensor, src_page: int = 0, dst_page: int = 0
) -> list[Run]:
    """Maximal runs where both index lists step by +1.

    A side with ``*_page > 0`` also starts a new run at each multiple of its page size.
    Indices are 1-D int64 CPU tensors of equal length.
    """
    return Runs.of(src_indices, dst_indices, src_page, dst_page).as_list()


def _copy(pairs: Pairs, runs: Runs) -> None:
    runs.copy(pairs, engine_device(pairs))


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


def check_lf_pairs(src_layers: object, dst_layers: object, page_size: object) -> tuple[Pairs, int]:
    """The checked (src, dst) pairs of :func:`transfer_kv_direct` and its page size."""
    srcs, dsts = _tensors("src_layers", src_layers), _tensors("dst_layers", dst_layers)
    if len(srcs) != len(dsts):
        raise ValueError(f"src_layers and dst_layers differ in length: {len(srcs)} != {len(dsts)}")
    for j, (src, dst) in enumerate(zip(srcs, dsts, strict=True)):
        _check_pair(f"src_layers[{j}]", src, src.shape[1:], f"dst_layers[{j}]", dst, dst.shape[1:])
    page = check_int("page_size", page_size, minimum=1)
    return [(Slots(src), Slots(dst)) for src, dst in zip(srcs, dsts, strict=True)], page


def _layers_per_buffer(
    buffers_name: str, buffers: list[torch.Tensor], layers_name: str, layers: list[torch.Tensor]
) -> int:
    """How many layers each page_first_direct buffer pairs with: ``len(layers)`` must be a
    positive multiple of ``len(buffers)`` (``k_layers + v_layers`` against ``[host_k, host_v]``)."""
    if len(layers) % len(buffers):
        raise ValueError(
            f"{layers_name} must hold a multiple of len({buffers_name}) = {len(buffers)} "
            f"tensors (the same number of layers for each), got {len(layers)}"
        )
    return len(layers) // len(buffers)


def check_pf_lf_pairs(
    src_ptrs: object, dst_ptrs: object, layer_id: object, page_size: object
) -> tuple[Pairs, int]:
    """The checked (src, dst) pairs of :func:`transfer_kv_per_layer_direct_pf_lf`, page size."""
    srcs, dsts = _tensors("src_ptrs", src_ptrs), _tensors("dst_ptrs", dst_ptrs)
    n = _layers_per_buffer("src_ptrs", srcs, "dst_ptrs", dsts)
    page = check_int("page_size", page_size, minimum=1)
    first = 0
    for i, src in enumerate(srcs):
        _check_paged(f"src_ptrs[{i}]", src, page)
        first = check.check_layer_id(layer_id, src.shape[1])
        if first + n > src.shape[1]:
            raise IndexError(
                f"layer_id {first} + {n} layers (len(dst_ptrs) / len(src_ptrs)) is out of "
                f"range for {src.shape[1]} layers"
            )
    for k, dst in enumerate(dsts):
        src = srcs[k // n]
        _check_pair(f"src_ptrs[{k // n}]", src, src.shape[3:], f"dst_ptrs[{k}]", dst, dst.shape[1:])
    return [(Slots(srcs[k // n], first + k % n), Slots(dst)) for k, dst in enumerate(dsts)], page


def check_lf_pf_pairs(src_ptrs: object, dst_ptrs: object, page_size: object) -> tuple[Pairs, int]:
    """The checked (src, dst) pairs of :func:`transfer_kv_all_layer_direct_lf_pf`, page size."""
    srcs, dsts = _tensors("src_ptrs", src_ptrs), _tensors("dst_ptrs", dst_ptrs)
    page = check_int("page_size", page_size, minimum=1)
    for j, dst in enumerate(dsts):
        _check_paged(f"dst_ptrs[{j}]", dst, page)
        if dst.shape != dsts[0].shape:
            raise ValueError(
                f"dst_ptrs[{j}] has shape {tuple(dst.shape)}, dst_ptrs[0] "
                f"{tuple(dsts[0].shape)}; they must match"
            )
    n = _layers_per_buffer("dst_ptrs", dsts, "src_ptrs", srcs)
    if n > dsts[0].shape[1]:
        raise ValueError(
            f"src_ptrs holds {n} layers per dst_ptrs buffer; the buffers have "
            f"{dsts[0].shape[1]} layers"
        )
    for k, src in enumerate(srcs):
        dst = dsts[k // n]
        _check_pair(f"src_ptrs[{k}]", src, src.shape[1:], f"dst_ptrs[{k // n}]", dst, dst.shape[3:])
    return [(Slots(src), Slots(dsts[k // n], k % n)) for k, src in enumerate(srcs)], page


def slot_limit(side: Slots) -> int:
    """Slots of one side: rows of a layer_first tensor, pages * page_size of a paged one."""
    shape = side.tensor.shape
    return shape[0] if side.layer is None else shape[0] * shape[2]


def checked_runs(pairs: Pairs, src_indices: object, dst_indices: object, page: int) -> Runs:
    """The runs of ``pairs`` over checked CPU copies of both index tensors (``page``: a checked
    page size; a run never crosses a page of a page_first_direct side)."""
    n = check.check_indices(src_indices, dst_indices)
    if n % page:
        raise ValueError(f"len(src_indices) ({n}) must be a multiple of page_size ({page})")
    assert isinstance(src_indices, torch.Tensor) and isinstance(dst_indices, torch.Tensor)
    s, d = src_indices.cpu(), dst_indices.cpu()
    check.check_index_range("src_indices", s, min(slot_limit(src) for src, _ in pairs))
    check.check_index_range("dst_indices", d, min(slot_limit(dst) for _, dst in pairs))
    src, dst = pairs[0]
    return Runs.of(s, d, 0 if src.layer is None else page, 0 if dst.layer is None else page)


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
    pairs, page = check_lf_pairs(src_layers, dst_layers, page_size)
    _copy(pairs, checked_runs(pairs, src_indices, dst_indices, page))


def transfer_kv_per_layer_direct_pf_lf(
    src_ptrs: list[torch.Tensor],
    dst_ptrs: list[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    layer_id: int,
    page_size: int,
) -> None:
    """Layers ``layer_id ..`` of page_first_direct buffers into layer_first buffers, one layer
    per destination (as sgl-kernel): with ``m = len(dst_ptrs) / len(src_ptrs)``,
    ``dst_ptrs[i * m + j]`` receives layer ``layer_id + j`` of ``src_ptrs[i]``.

    Parameters
    ----------
    src_ptrs : ``[host_k, host_v]`` (MLA ``[host_kv]``), each ``[pages, layers, page_size, ...]``.
    dst_ptrs : ``k_layers + v_layers`` (MLA ``kv_layers``), ``m`` tensors ``[slots, ...]`` per
        source; usually ``m = 1``: ``[k_layer, v_layer]`` (MLA ``[kv_layer]``).
    src_indices, dst_indices : int64 ``[n]`` slot indices, ``n % page_size == 0``, any device.
    layer_id : int, the first layer; ``layer_id + m <= layers``.
    page_size : int >= 1, the page dimension of ``src_ptrs``.
    """
    pairs, page = check_pf_lf_pairs(src_ptrs, dst_ptrs, layer_id, page_size)
    _copy(pairs, checked_runs(pairs, src_indices, dst_indices, page))


def transfer_kv_all_layer_direct_lf_pf(
    src_ptrs: list[torch.Tensor],
    dst_ptrs: list[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    page_size: int,
) -> None:
    """The given layer_first layers into page_first_direct buffers, layers ``0 .. m - 1``
    (as sgl-kernel), ``m = len(src_ptrs) / len(dst_ptrs)``; the other layers are untouched.

    Parameters
    ----------
    src_ptrs : ``k_layers + v_layers`` (MLA ``kv_layers``): ``m`` tensors ``[slots, ...]`` per
        destination, ``m <= layers``; ``src_ptrs[j * m + l]`` is layer ``l`` of ``dst_ptrs[j]``.
    dst_ptrs : ``[host_k, host_v]`` (MLA ``[host_kv]``), each ``[pages, layers, page_size, ...]``.
    src_indices, dst_indices : int64 ``[n]`` slot indices, ``n % page_size == 0``, any device.
    page_size : int >= 1, the page dimension of ``dst_ptrs``.
    """
    pairs, page = check_lf_pf_pairs(src_ptrs, dst_ptrs, page_size)
    _copy(pairs, checked_runs(pairs, src_indices, dst_indices, page))
