"""Argument checks shared by every transfer op.

Each check raises before anything is written: ``TypeError`` for a wrong type or dtype,
``ValueError`` for a wrong value, shape or device, ``IndexError`` for an item index or layer id out
of range. Messages name the argument. Index ranges are checked whenever the indices are on the CPU;
CUDA index tensors are checked only with ``HICACHE_CHECK_DEVICE_INDICES`` (a device sync), and the
kernels themselves skip out-of-range items so that memory is never corrupted. The one bound no
check knows is the item count behind a pointer table's addresses: the ``*_items_per_layer``
keywords of the all-layer ops give it; without them only negative indices are caught there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from hicache import env
from hicache.checks import check_index_tensor, check_int
from hicache.kernels.layouts import Operand

MAX_THREADS_PER_BLOCK = 1024
WARP_SIZE = 64 if torch.version.hip else 32


def check_item_size(item_size: object) -> int:
    """Bytes of one item in one layer: a positive multiple of 8 (the kernels copy 8-byte words)."""
    size = check_int("item_size", item_size, minimum=1)
    if size % 8:
        raise ValueError(f"item_size must be a multiple of 8 bytes, got {size}")
    return size


def check_divides(name: str, value: int, divisor_name: str, divisor: int) -> None:
    if value % divisor:
        raise ValueError(f"{name} ({value}) must be a multiple of {divisor_name} ({divisor})")


def check_layer_id(layer_id: object, num_layers: int) -> int:
    layer = check_int("layer_id", layer_id)
    if layer >= num_layers:
        raise IndexError(f"layer_id {layer} is out of range for {num_layers} layers")
    return layer


def check_launch(block_quota: object, num_warps_per_block: object) -> None:
    """``block_quota >= 1``; ``num_warps_per_block`` a power of two that fits one block."""
    check_int("block_quota", block_quota, minimum=1)
    warps = check_int("num_warps_per_block", num_warps_per_block, minimum=1)
    max_warps = MAX_THREADS_PER_BLOCK // WARP_SIZE
    if warps & (warps - 1) or warps > max_warps:
        raise ValueError(
            f"num_warps_per_block must be a power of two in [1, {max_warps}], got {warps}"
        )


def check_indices(src_indices: object, dst_indices: object) -> int:
    """Both 1-D int64 tensors of the same length; returns that length."""
    src_indices = check_index_tensor("src_indices", src_indices)
    dst_indices = check_index_tensor("dst_indices", dst_indices)
    if src_indices.numel() != dst_indices.numel():
        raise ValueError(
            f"src_indices and dst_indices differ in length: "
            f"{src_indices.numel()} != {dst_indices.numel()}"
        )
    return src_indices.numel()


def _range_is_checkable(tensor: torch.Tensor) -> bool:
    return tensor.numel() > 0 and (tensor.device.type == "cpu" or env.device_indices_checked())


def check_index_range(name: str, indices: torch.Tensor, limit: int | None) -> None:
    """Every index in ``[0, limit)``, or ``>= 0`` when ``limit`` is None (an unknown size).

    Checked on CPU; on CUDA when ``HICACHE_CHECK_DEVICE_INDICES`` asks (one device sync).
    """
    if not _range_is_checkable(indices):
        return
    low, high = (int(v) for v in torch.aminmax(indices))
    if limit is None and low < 0:
        raise IndexError(f"{name} holds {low}; item indices must be >= 0")
    if limit is not None and (low < 0 or high >= limit):
        raise IndexError(f"{name} holds {low if low < 0 else high}, outside [0, {limit})")


def check_data(named: Mapping[str, object], row_bytes: int) -> None:
    """Contiguous tensors of one dtype, shape and device whose dim-0 rows are ``row_bytes``."""
    first_name, first = None, None
    for name, tensor in named.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() == 0 or not tensor.is_contiguous():
            raise ValueError(f"{name} must be a contiguous tensor with at least one dimension")
        got = math.prod(tensor.shape[1:]) * tensor.element_size()
        if got != row_bytes:
            raise ValueError(
                f"{name} has {got} bytes per dim-0 row; this layout and item_size need {row_bytes}"
            )
        if first is None:
            first_name, first = name, tensor
        elif (tensor.dtype, tensor.shape, tensor.device) != (
            first.dtype,
            first.shape,
            first.device,
        ):
            raise ValueError(
                f"{name} ({tensor.dtype}, {tuple(tensor.shape)}, {tensor.device}) "
                f"must match {first_name} ({first.dtype}, {tuple(first.shape)}, "
                f"{first.device})"
            )


def check_tables(named: Mapping[str, object], num_layers: int) -> None:
    """uint64 pointer tables of ``num_layers`` non-null, 8-byte aligned addresses."""
    for name, table in named.items():
        if not isinstance(table, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(table).__name__}")
        if table.dtype != torch.uint64:
            raise TypeError(f"{name} must be a uint64 pointer table, got {table.dtype}")
        if table.dim() != 1 or table.numel() != num_layers:
            raise ValueError(
                f"{name} must hold num_layers={num_layers} addresses, "
                f"got shape {tuple(table.shape)}"
            )
        if _range_is_checkable(table):
            addresses = table.view(torch.int64)
            if bool(((addresses == 0) | (addresses % 8 != 0)).any()):
                raise ValueError(f"{name} holds a null or not 8-byte aligned address")


def check_devices(src: Operand, dst: Operand, indices: dict[str, torch.Tensor]) -> torch.device:
    """The device the copy runs on: the one CUDA device among the buffers, else the CPU.

    With a CUDA device, CPU data tensors must be pinned (the kernel reaches them through unified
    addressing) and pointer tables must live on that device; index tensors may be on the CPU or
    that device.
    """
    named = src.named() + dst.named()
    for name, tensor in named:
        check_device_type(name, tensor)
    cuda = {t.device for _, t in named if t.device.type == "cuda"}
    if len(cuda) > 1:
        raise ValueError(f"buffers span several CUDA devices: {sorted(map(str, cuda))}")
    device = cuda.pop() if cuda else torch.device("cpu")
    if device.type == "cuda":
        for operand in (src, dst):
            _check_cuda_operand(operand, device)
    check_index_devices(indices, device)
    return device


def check_index_devices(indices: dict[str, torch.Tensor], device: torch.device) -> None:
    """``ValueError`` unless each of ``indices`` is on the CPU or ``device`` (the copy's)."""
    for name, idx in indices.items():
        if idx.device not in (device, torch.device("cpu")):
            raise ValueError(f"{name} is on {idx.device}; use the CPU or {device}")


def check_device_type(name: str, tensor: torch.Tensor) -> None:
    """``ValueError`` unless ``tensor`` is on the CPU or a CUDA device (not ``meta`` etc.)."""
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} is on {tensor.device}; use the CPU or a CUDA device")


def _check_cuda_operand(operand: Operand, device: torch.device) -> None:
    for name, tensor in operand.named():
        if operand.is_table and tensor.device != device:
            raise ValueError(f"pointer table {name} must be on {device}, got {tensor.device}")
        if tensor.device.type == "cpu" and not tensor.is_pinned():
            raise ValueError(f"{name} is unpinned host memory; a CUDA copy needs it pinned")


def check_layer_buffers(
    name: str, layers: Sequence[Mapping[str, torch.Tensor]], check_pinned: bool
) -> tuple[tuple[torch.Tensor, ...], ...]:
    """Every layer's buffers laid out as layer 0's (which the caller validated): the same names,
    and per name the same dtype, shape, strides and device, and (``check_pinned``: a CUDA copy)
    CPU ones pinned alike. Returns each layer's buffers as a tuple, in layer 0's name order."""
    if not layers:
        raise ValueError(f"{name} must hold at least one layer")
    names = tuple(layers[0])
    first = tuple(layers[0].values())
    for layer, named in enumerate(layers[1:], start=1):
        if tuple(named) != names:
            raise ValueError(f"{name}[{layer}] has buffers {tuple(named)}, layer 0 has {names}")
        for key, tensor, ref in zip(names, named.values(), first, strict=True):
            _check_like(f"{name}[{layer}][{key!r}]", tensor, ref, check_pinned)
    return tuple(tuple(named.values()) for named in layers)


def _check_like(name: str, tensor: object, ref: torch.Tensor, check_pinned: bool) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    got = (tensor.dtype, tuple(tensor.shape), tensor.stride(), tensor.device)
    want = (ref.dtype, tuple(ref.shape), ref.stride(), ref.device)
    if got != want:
        raise ValueError(f"{name} is {got} but layer 0's is {want}; every layer must match")
    if check_pinned and tensor.device.type == "cpu" and tensor.is_pinned() != ref.is_pinned():
        raise ValueError(f"{name} is pinned={tensor.is_pinned()} unlike layer 0's buffer")
