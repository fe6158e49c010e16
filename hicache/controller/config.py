"""Validated settings of a HiCacheController and the checks its public calls run first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hicache import env
from hicache.checks import check_choice, check_int
from hicache.pools import (
    DevicePool,
    HostKVPool,
    HostPool,
    HybridKVPoolHost,
    SlotAllocator,
    check_pair,
)

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
# How a lower tier relates to the one above it: ``inclusive`` (a page copied down stays above
# too) or ``exclusive`` (a page lives in one of the two: it moves down when evicted above and a
# load-back moves it up).
TIERINGS = ("inclusive", "exclusive")


@dataclass(frozen=True)
class ControllerConfig:
    """Validated settings of a :class:`HiCacheController`.

    Attributes
    ----------
    page_size : slots per page; equal to the allocator's and the host pool's.
    write_policy : one of :data:`WRITE_POLICIES`. The controller only records it; acting on it
        (when to call ``write``) is the radix cache's job.
    io_backend : ``"kernel"`` (Triton transfer kernels), ``"direct"`` (copy engines, one copy
        per run) or ``"auto"`` (one of the two per batch: ``hicache.pools.auto_backend``).
    host_layout : layout of the host pool; must be one of ``SUPPORTED_PAIRS[io_backend]``
        (``hicache.pools``: kernel: layer_first, page_first, page_head; direct: layer_first,
        page_first_direct).
    layers_ahead : None (every layer of a load batch issued by ``start_loading``) or an int
        ``>= 1`` (layers issued there; the rest as the forward pass reaches them).
    """

    page_size: int
    write_policy: str
    io_backend: str
    host_layout: str
    layers_ahead: int | None = None

    def __post_init__(self) -> None:
        check_write_policy(self.write_policy)
        check_pair(self.host_layout, self.io_backend, name="mem_pool_host.layout")
        check_int("page_size", self.page_size, minimum=1)
        if self.layers_ahead is not None:
            check_int("layers_ahead", self.layers_ahead, minimum=1)


def check_write_policy(write_policy: object) -> str:
    """``write_policy`` if it is one of :data:`WRITE_POLICIES`, else ``ValueError``: the one
    check of a write policy (the radix config calls it too)."""
    return check_choice("write_policy", write_policy, WRITE_POLICIES)


def check_tiering(tiering: object) -> str:
    """``tiering`` if it is one of :data:`TIERINGS`, else ``ValueError``."""
    return check_choice("tiering", tiering, TIERINGS)


class SetLike(Protocol):
    """A ``load_cache_event``: anything with ``set()`` (e.g. ``threading.Event``)."""

    def set(self) -> None: ...


def check_load_cache_event(event: Any) -> None:
    """``TypeError`` unless ``event`` is None or has a ``set()`` method."""
    if event is not None and not callable(getattr(event, "set", None)):
        raise TypeError("load_cache_event must be None or have a set() method")


def check_host_pool(host_pool: Any) -> None:
    """``TypeError`` unless ``host_pool`` is a host KV pool (MHA, MLA, or a
    ``HybridKVPoolHost``)."""
    if not isinstance(host_pool, (HostKVPool, HybridKVPoolHost)):
        raise TypeError(
            f"mem_pool_host must be an MHATokenToKVPoolHost, MLATokenToKVPoolHost or "
            f"HybridKVPoolHost, got {type(host_pool).__name__}"
        )


def check_pools(allocator: SlotAllocator, host_pool: HostPool, page_size: int) -> DevicePool:
    """The allocator's device pool, once it is known to fit: ``ValueError`` unless the allocator
    has one, both pools agree with the controller on ``page_size``, and ``host_pool`` was built
    for that device pool's whole geometry (kind, layers, heads and dims, dtype, device)."""
    if not callable(getattr(allocator, "get_kvcache", None)):
        raise TypeError("token_to_kv_pool_allocator must have get_kvcache()")
    device_pool = allocator.get_kvcache()
    if device_pool is None:
        raise ValueError("token_to_kv_pool_allocator has no device KV pool (get_kvcache() is None)")
    if allocator.page_size != page_size or host_pool.page_size != page_size:
        raise ValueError(
            f"page_size={page_size} must equal the allocator's ({allocator.page_size}) "
            f"and the host pool's ({host_pool.page_size})"
        )
    differences = host_pool.mismatch(device_pool)
    if differences:
        raise ValueError(
            "mem_pool_host was built for a device pool of another geometry (kind, layers, heads, "
            "dims, dtype, page size, device) than token_to_kv_pool_allocator's: "
            + "; ".join(differences)
        )
    return device_pool


def check_node_id(node_id: Any) -> None:
    if isinstance(node_id, bool) or not isinstance(node_id, int):
        raise TypeError(f"node_id must be an int, got {type(node_id).__name__}")


def check_indices(
    name: str, indices: Any, page_size: int, device: torch.device, limit: int
) -> None:
    """``TypeError``/``ValueError`` naming ``name`` unless ``indices`` is a 1-D int64 tensor of a
    positive multiple of ``page_size`` slots on ``device``; ``IndexError``
    for a slot outside ``[0, limit)`` (CPU indices, or CUDA ones with
    ``HICACHE_CHECK_DEVICE_INDICES``): caught here, not when the queued batch is issued."""
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(indices).__name__}")
    if indices.dtype != torch.int64 or indices.dim() != 1:
        raise TypeError(
            f"{name} must be a 1-D int64 tensor, got {indices.dtype} {tuple(indices.shape)}"
        )
    if indices.numel() == 0 or indices.numel() % page_size:
        raise ValueError(
            f"{name} must hold a positive multiple of page_size={page_size} slots, "
            f"got {indices.numel()}"
        )
    if indices.device != device:
        raise ValueError(f"{name} must be on {device}, got {indices.device}")
    if indices.device.type == "cpu":  # numpy: a small torch reduction costs several times more
        values = indices.numpy()
        low, high = int(values.min()), int(values.max())
    elif env.device_indices_checked():
        low, high = int(indices.min()), int(indices.max())
    else:
        return
    if low < 0 or high >= limit:
        raise IndexError(f"{name} must lie in [0, {limit}), got values in [{low}, {high}]")
