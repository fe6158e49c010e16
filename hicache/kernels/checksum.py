"""Page checksums of device KV: one 63-bit value per page per layer, to catch corrupt load-backs.

A *page* is ``page_size`` consecutive entries of a slot-index tensor (``indices[p * page_size +
t]``, ``t`` its position); its checksum at layer ``l`` covers the bytes of those slots in every
part (K and V for MHA, the latent for MLA) of layer ``l``. The bytes are read as unsigned words of
``word`` bytes (4 when the item size allows, else 2 or 1), zero-extended to 32 bits; word ``j`` of
position ``t`` of part ``k`` has index ``i = (k * page_size + t) * W + j`` (``W`` words an item)::

    key = i * KEY_MUL                                   (all mod 2**32)
    h1 = mix(w ^ key, A1, B1)       h2 = mix(w ^ (key + KEY_ADD), A2, B2)
    checksum = (sum h1 mod 2**32) + (sum h2 mod 2**31) * 2**32

``mix`` is a xorshift-multiply finalizer (bijective on 32 bits). So any change confined to one
word (a single-bit flip, a torn byte) always changes the checksum, and the position-dependent key
makes swapped tokens, swapped K/V or shifted slots change it too (with probability 1 - 2**-63
for changes spanning several words); an all-zero page does not checksum to zero.

Ops (all validate first, naming the argument; nothing is written on bad input):
``page_checksums`` returns int64 ``[pages, layers]``; ``record_page_checksums`` writes them into
``store[rows[p], l]``; ``verify_page_checksums`` compares with ``store[rows[p], l]`` and returns
int64 ``[2]``: the first page that differs in any layer (``pages`` when none) and how many differ.
``store`` may be a column block of a wider table (rows strided, columns contiguous). With
``skip_pad=True`` a page holding slot 0 (a padding slot: a tombstoned SWA token's) records
``NO_SUM`` and is never reported: its bytes are no token's.

Backends: a Triton kernel when the buffers are on CUDA (a persistent grid of at most
``max_programs`` programs, one (page, layer) work item at a time; it reads the layers through a
pointer table and reads or writes ``store``, pinned host memory, directly), the torch reference on
the CPU. ``backend="triton"`` runs the kernel on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
CUDA slot indices are range-checked only with ``HICACHE_CHECK_DEVICE_INDICES``; the kernel skips
out-of-range slots (their words are left out, so a verify reports that page as bad).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hicache import env
from hicache.checks import check_int
from hicache.kernels.checksum_reference import (
    A1,
    A2,
    B1,
    B2,
    KEY_ADD,
    KEY_MUL,
    PageGeometry,
    reference_checksums,
)

__all__ = [
    "A1",
    "A2",
    "B1",
    "B2",
    "DEFAULT_PROGRAMS",
    "KEY_ADD",
    "KEY_MUL",
    "NO_SUM",
    "page_checksums",
    "record_page_checksums",
    "verify_page_checksums",
]

DEFAULT_PROGRAMS = 64
NO_SUM = -1  # a store row's value for "no checksum recorded": checksums are never negative


def _check_layers(layers: Sequence[Sequence[torch.Tensor]]) -> PageGeometry:
    """Every part has the same number of layers; every layer is a contiguous tensor of one
    shape, dtype and device, indexed by slot along dim 0."""
    if (
        not isinstance(layers, Sequence)
        or not layers
        or not all(isinstance(part, Sequence) and part for part in layers)
    ):
        raise TypeError("layers must be a non-empty sequence of non-empty sequences of tensors")
    first = layers[0][0]
    if not isinstance(first, torch.Tensor) or first.dim() < 1 or first.numel() == 0:
        raise TypeError("layers must hold non-empty torch.Tensors indexed by slot along dim 0")
    for part in layers:
        if len(part) != len(layers[0]):
            raise ValueError("layers: every part must have the same number of layers")
        for t in part:
            if (
                not isinstance(t, torch.Tensor)
                or t.shape != first.shape
                or t.dtype != first.dtype
                or t.device != first.device
                or not t.is_contiguous()
            ):
                raise ValueError("layers must be contiguous tensors of one shape, dtype and device")
    item = first.numel() // first.shape[0] * first.element_size()
    return PageGeometry(len(layers), len(layers[0]), first.shape[0], item, first.device)


def _check_indices(geo: PageGeometry, indices: object, page_size: object) -> int:
    """The number of pages in ``indices``."""
    check_int("page_size", page_size, minimum=1)
    assert isinstance(page_size, int)
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"indices must be a torch.Tensor, got {type(indices).__name__}")
    if indices.dtype != torch.int64 or indices.dim() != 1:
        raise TypeError(f"indices must be 1-D int64, got {indices.dtype} {tuple(indices.shape)}")
    if indices.device != geo.device:
        raise ValueError(f"indices must be on {geo.device}, got {indices.device}")
    if indices.numel() % page_size:
        raise ValueError(f"indices ({indices.numel()}) must be whole pages of {page_size}")
    if indices.numel() and (indices.is_cpu or env.device_indices_checked()):
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= geo.slots:
            raise IndexError(f"indices must lie in [0, {geo.slots}), got [{low}, {high}]")
    return indices.numel() // page_size


def _check_store(geo: PageGeometry, store: object, rows: object, pages: int) -> None:
    if not isinstance(store, torch.Tensor) or not isinstance(rows, torch.Tensor):
        raise TypeError("store and rows must be torch.Tensors")
    if (
        store.dtype != torch.int64
        or store.dim() != 2
        or store.shape[1] != geo.layers
        or not store.is_cpu
        or (store.stride(1) != 1 and geo.layers > 1)
        or store.stride(0) < geo.layers
    ):
        raise ValueError(
            f"store must be an int64 CPU tensor [rows, {geo.layers}] with contiguous rows, got "
            f"{store.dtype} {tuple(store.shape)} on {store.device}"
        )
    if geo.device.type == "cuda" and not store.is_pinned():
        raise ValueError("store must be pinned (page-locked) when the layers are on CUDA")
    if rows.dtype != torch.int64 or rows.shape != (pages,) or not rows.is_cpu:
        raise ValueError(
            f"rows must be an int64 CPU tensor [{pages}] (one per page), got "
            f"{rows.dtype} {tuple(rows.shape)} on {rows.device}"
        )
    if pages and (int(rows.min()) < 0 or int(rows.max()) >= store.shape[0]):
        raise IndexError(f"rows must lie in [0, {store.shape[0]})")


# ---- public ops ----------------------------------------------------------------------------------


def _backend(geo: PageGeometry, backend: str | None, max_programs: object) -> str:
    check_int("max_programs", max_programs, minimum=1)
    if backend not in (None, "reference", "triton"):
        raise ValueError(f"backend must be None, 'reference' or 'triton', got {backend!r}")
    return backend or ("triton" if geo.device.type == "cuda" else "reference")


def launch_checksums(
    geo: PageGeometry,
    layers: Sequence[Sequence[torch.Tensor]],
    indices: torch.Tensor,
    page_size: int,
    store: torch.Tensor,
    rows: torch.Tensor,
    flags: torch.Tensor | None,
    max_programs: int,
    skip_pad: bool = False,
) -> None:
    """:func:`hicache.kernels.checksum_launch.launch_checksums`, imported on the first launch
    (it imports Triton, which ``import hicache`` must not)."""
    from hicache.kernels import checksum_launch

    checksum_launch.launch_checksums(
        geo, layers, indices, page_size, store, rows, flags, max_programs, skip_pad
    )


def _padded(indices: torch.Tensor, page_size: int) -> torch.Tensor:
    """bool ``[pages]``: which pages of ``indices`` hold slot 0."""
    return (indices.view(-1, page_size) == 0).any(1)


def page_checksums(
    layers: Sequence[Sequence[torch.Tensor]],
    indices: torch.Tensor,
    page_size: int,
    *,
    backend: str | None = None,
    max_programs: int = DEFAULT_PROGRAMS,
) -> torch.Tensor:
    """int64 ``[pages, layers]`` checksums of the pages of ``indices`` (on the layers' device).

    Parameters
    ----------
    layers : per part (K, V / latent), per layer, a contiguous tensor ``[slots, ...]`` (one
        shape, dtype and device throughout), e.g. a device pool's ``part_buffers``.
    indices : int64 ``[pages * page_size]`` slot indices on the layers' device.
    page_size : slots per page (>= 1).
    """
    geo = _check_layers(layers)
    pages = _check_indices(geo, indices, page_size)
    if _backend(geo, backend, max_programs) == "reference":
        return reference_checksums(geo, layers, indices, page_size)
    store = torch.empty((pages, geo.layers), dtype=torch.int64)
    store = store.pin_memory() if geo.device.type == "cuda" else store
    launch_checksums(
        geo, layers, indices, page_size, store, torch.arange(pages), None, max_programs
    )
    return store.to(geo.device)


def record_page_checksums(
    layers: Sequence[Sequence[torch.Tensor]],
    indices: torch.Tensor,
    page_size: int,
    store: torch.Tensor,
    rows: torch.Tensor,
    *,
    backend: str | None = None,
    max_programs: int = DEFAULT_PROGRAMS,
    skip_pad: bool = False,
) -> None:
    """Write page ``p``'s checksums into ``store[rows[p], :]`` (asynchronous on CUDA: on the
    current stream); with ``skip_pad``, ``NO_SUM`` for a page holding slot 0.

    ``store`` : int64 ``[R, layers]`` CPU tensor, pinned when the layers are on CUDA.
    ``rows`` : int64 ``[pages]`` CPU tensor in ``[0, R)``; with a repeated row, which page's
    checksum lands there is unspecified.
    """
    geo = _check_layers(layers)
    pages = _check_indices(geo, indices, page_size)
    _check_store(geo, store, rows, pages)
    if _backend(geo, backend, max_programs) == "reference":
        sums = reference_checksums(geo, layers, indices, page_size)
        if skip_pad:
            sums[_padded(indices, page_size)] = NO_SUM
        store[rows] = sums.to(store.device)
    else:
        launch_checksums(geo, layers, indices, page_size, store, rows, None, max_programs, skip_pad)


def verify_page_checksums(
    layers: Sequence[Sequence[torch.Tensor]],
    indices: torch.Tensor,
    page_size: int,
    store: torch.Tensor,
    rows: torch.Tensor,
    *,
    backend: str | None = None,
    max_programs: int = DEFAULT_PROGRAMS,
    skip_pad: bool = False,
) -> torch.Tensor:
    """int64 ``[2]`` on the layers' device: (first page whose checksum differs from
    ``store[rows[p], :]`` in some layer, or ``pages`` when none; how many pages differ; with
    ``skip_pad``, a page holding slot 0 never differs).
    Asynchronous on CUDA (current stream); ``store``/``rows`` as :func:`record_page_checksums`."""
    geo = _check_layers(layers)
    pages = _check_indices(geo, indices, page_size)
    _check_store(geo, store, rows, pages)
    if _backend(geo, backend, max_programs) == "reference":
        expected = store[rows].to(geo.device)
        bad = (reference_checksums(geo, layers, indices, page_size) != expected).any(1)
        if skip_pad:
            bad &= ~_padded(indices, page_size)
    else:
        flags = torch.zeros(pages * geo.layers, dtype=torch.int8, device=geo.device)
        launch_checksums(
            geo, layers, indices, page_size, store, rows, flags, max_programs, skip_pad
        )
        bad = flags.view(pages, geo.layers).any(1)
    count = bad.sum()
    first = bad.to(torch.int8).argmax() if pages else count
    return torch.stack([torch.where(count > 0, first, pages), count])
