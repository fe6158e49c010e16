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

Backends: a Triton kernel when the buffers are on CUDA (a persistent grid of at most
``max_programs`` programs, one (page, layer) work item at a time; it reads the layers through a
pointer table and reads or writes ``store``, pinned host memory, directly), the torch reference on
the CPU. ``backend="triton"`` runs the kernel on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
CUDA slot indices are range-checked only with ``HICACHE_CHECK_DEVICE_INDICES``; the kernel skips
out-of-range slots (their words are left out, so a verify reports that page as bad).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hicache import env
from hicache.checks import check_int

KEY_MUL, KEY_ADD = 0x61C88647, 0x1B873593
A1, B1, A2, B2 = 0x7FEB352D, 0x2C1B3C6D, 0x6A09E667, 0x3C6EF373
DEFAULT_PROGRAMS = 64
TILE_WORDS = 2048  # words one program hashes per step: [ROWS, COLS]
_M32 = (1 << 32) - 1
_WORDS = {
    4: (torch.int32, tl.int32, tl.uint32),
    2: (torch.int16, tl.int16, tl.uint16),
    1: (torch.int8, tl.int8, tl.uint8),
}
_TABLES: dict[tuple, torch.Tensor] = {}  # pointer tables by (device, addresses); bounded


@dataclass(frozen=True)
class _Geometry:
    parts: int
    layers: int
    slots: int
    item_bytes: int
    device: torch.device

    @property
    def word(self) -> int:
        return 4 if self.item_bytes % 4 == 0 else 2 if self.item_bytes % 2 == 0 else 1


def _check_layers(layers: Sequence[Sequence[torch.Tensor]]) -> _Geometry:
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
    return _Geometry(len(layers), len(layers[0]), first.shape[0], item, first.device)


def _check_indices(geo: _Geometry, indices: object, page_size: object) -> int:
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


def _check_store(geo: _Geometry, store: object, rows: object, pages: int) -> None:
    if not isinstance(store, torch.Tensor) or not isinstance(rows, torch.Tensor):
        raise TypeError("store and rows must be torch.Tensors")
    if (
        store.dtype != torch.int64
        or store.dim() != 2
        or store.shape[1] != geo.layers
        or not store.is_cpu
        or not store.is_contiguous()
    ):
        raise ValueError(
            f"store must be a contiguous int64 CPU tensor [rows, {geo.layers}], got "
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


# ---- torch reference -------------------------------------------------------------------------


def _mix(x: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """The 32-bit finalizer on int64 lanes holding values < 2**32 (products stay < 2**63)."""
    x = x ^ (x >> 16)
    x = (x * a) & _M32
    x = x ^ (x >> 15)
    x = (x * b) & _M32
    return x ^ (x >> 16)


def _reference(
    geo: _Geometry, layers: Sequence[Sequence[torch.Tensor]], indices: torch.Tensor, page_size: int
) -> torch.Tensor:
    pages, word = indices.numel() // page_size, geo.word
    per_item = geo.item_bytes // word
    n = geo.parts * page_size * per_item
    key = (torch.arange(n, device=geo.device) * KEY_MUL) & _M32
    key2 = (key + KEY_ADD) & _M32
    out = torch.empty((pages, geo.layers), dtype=torch.int64, device=geo.device)
    for layer in range(geo.layers):
        parts = [
            part[layer][indices].view(torch.uint8).reshape(pages, page_size, geo.item_bytes)
            for part in layers
        ]
        words = torch.stack(parts, 1).view(_WORDS[word][0]).reshape(pages, n)
        w = words.to(torch.int64) & ((1 << 8 * word) - 1)
        s1 = _mix(w ^ key, A1, B1).sum(1) & _M32
        s2 = _mix(w ^ key2, A2, B2).sum(1) & 0x7FFFFFFF
        out[:, layer] = s1 + (s2 << 32)
    return out


# ---- Triton ------------------------------------------------------------------------------------

# Compiled kernels read globals only as constexpr (the interpreter is laxer).
_TL_KEY_MUL, _TL_KEY_ADD = tl.constexpr(KEY_MUL), tl.constexpr(KEY_ADD)
_TL_A1, _TL_B1 = tl.constexpr(A1), tl.constexpr(B1)
_TL_A2, _TL_B2 = tl.constexpr(A2), tl.constexpr(B2)


@triton.jit
def _tl_mix(x, A: tl.constexpr, B: tl.constexpr):
    x = x ^ (x >> 16)
    x = x * A
    x = x ^ (x >> 15)
    x = x * B
    return x ^ (x >> 16)


@triton.jit(do_not_specialize=["n_pages", "num_slots", "store_addr"])
def _checksum_kernel(
    slots_ptr,
    rows_ptr,
    table_ptr,
    flags_ptr,
    store_addr,
    n_pages,
    num_layers,
    num_slots,
    NUM_KV: tl.constexpr,
    PAGE: tl.constexpr,
    WORDS: tl.constexpr,
    ITEM_BYTES: tl.constexpr,
    WORD_TY: tl.constexpr,
    UWORD_TY: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    VERIFY: tl.constexpr,
):
    """Work item ``w`` is (page ``w // num_layers``, layer ``w % num_layers``); records its
    checksum at ``store[rows[page], layer]`` or, with VERIFY, writes ``flags[w] = differs``.

    Tile rows are (part, position) pairs ``r = kv * PAGE + t``, so K and V of a small page load
    together; columns are words of an item.
    """
    r_in = tl.arange(0, ROWS)[:, None]
    j_in = tl.arange(0, COLS)[None, :]
    store = store_addr.to(tl.int64).to(tl.pointer_type(tl.int64))
    for w in range(tl.program_id(0), n_pages * num_layers, tl.num_programs(0)):
        page = w // num_layers
        layer = w - page * num_layers
        acc1 = tl.zeros([ROWS, COLS], dtype=tl.int64)
        acc2 = tl.zeros([ROWS, COLS], dtype=tl.int64)
        for r0 in range(0, NUM_KV * PAGE, ROWS):
            r = r0 + r_in
            live = r < NUM_KV * PAGE
            kv = r // PAGE
            slot = tl.load(slots_ptr + page * PAGE + (r - kv * PAGE), mask=live, other=0)
            base = tl.load(table_ptr + kv * num_layers + layer, mask=live, other=0)
            s_ok = live & (slot >= 0) & (slot < num_slots)
            row = (base + tl.where(s_ok, slot, 0) * ITEM_BYTES).to(tl.pointer_type(WORD_TY))
            for j0 in range(0, WORDS, COLS):
                j = j0 + j_in
                ok = s_ok & (j < WORDS)
                word = tl.load(row + j, mask=ok, other=0).to(UWORD_TY, bitcast=True)
                word = word.to(tl.uint32)
                key = (r * WORDS + j).to(tl.uint32) * _TL_KEY_MUL
                h1 = _tl_mix(word ^ key, _TL_A1, _TL_B1)
                h2 = _tl_mix(word ^ (key + _TL_KEY_ADD), _TL_A2, _TL_B2)
                acc1 += tl.where(ok, h1, 0).to(tl.int64)
                acc2 += tl.where(ok, h2, 0).to(tl.int64)
        value = tl.sum(acc1) % 4294967296 + (tl.sum(acc2) % 2147483648) * 4294967296
        target = store + tl.load(rows_ptr + page) * num_layers + layer
        if VERIFY:
            tl.store(flags_ptr + w, (value != tl.load(target)).to(tl.int8))
        else:
            tl.store(target, value)


def _table(layers: Sequence[Sequence[torch.Tensor]], device: torch.device) -> torch.Tensor:
    """int64 ``[parts * layers]`` of the layers' addresses on ``device`` (cached)."""
    addresses = tuple(t.data_ptr() for part in layers for t in part)
    key = (device, addresses)
    if key not in _TABLES:
        if len(_TABLES) >= 16:
            _TABLES.pop(next(iter(_TABLES)))
        _TABLES[key] = torch.tensor(addresses, dtype=torch.int64, device=device)
    return _TABLES[key]


def _launch(
    geo: _Geometry,
    layers: Sequence[Sequence[torch.Tensor]],
    indices: torch.Tensor,
    page_size: int,
    store: torch.Tensor,
    rows: torch.Tensor,
    flags: torch.Tensor | None,
    max_programs: int,
) -> None:
    assert geo.device.type == "cuda" or env.ENV.triton_interpret, (
        "Triton on CPU tensors needs TRITON_INTERPRET=1 set before triton is imported"
    )
    pages, (_, word_ty, uword_ty) = rows.numel(), _WORDS[geo.word]
    if pages == 0:
        return
    cuda = geo.device.type == "cuda"
    words = geo.item_bytes // geo.word
    assert geo.parts * page_size * words < 2**31, "word positions overflow int32"
    cols = min(triton.next_power_of_2(words), TILE_WORDS)
    tile_rows = max(1, min(triton.next_power_of_2(geo.parts * page_size), TILE_WORDS // cols))
    rows_dev = rows.pin_memory().to(geo.device, non_blocking=True) if cuda else rows
    grid = (min(max_programs, pages * geo.layers),)
    with torch.cuda.device(geo.device) if cuda else contextlib.nullcontext():
        _checksum_kernel[grid](
            indices.contiguous(),
            rows_dev,
            _table(layers, geo.device),
            rows_dev if flags is None else flags,
            store.data_ptr(),
            pages,
            geo.layers,
            geo.slots,
            NUM_KV=geo.parts,
            PAGE=page_size,
            WORDS=words,
            ITEM_BYTES=geo.item_bytes,
            WORD_TY=word_ty,
            UWORD_TY=uword_ty,
            ROWS=tile_rows,
            COLS=cols,
            VERIFY=flags is not None,
            num_warps=max(1, min(8, tile_rows * cols // 256)),
        )


# ---- public ops ----------------------------------------------------------------------------------


def _backend(geo: _Geometry, backend: str | None, max_programs: object) -> str:
    check_int("max_programs", max_programs, minimum=1)
    if backend not in (None, "reference", "triton"):
        raise ValueError(f"backend must be None, 'reference' or 'triton', got {backend!r}")
    return backend or ("triton" if geo.device.type == "cuda" else "reference")


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
        return _reference(geo, layers, indices, page_size)
    store = torch.empty((pages, geo.layers), dtype=torch.int64)
    store = store.pin_memory() if geo.device.type == "cuda" else store
    _launch(geo, layers, indices, page_size, store, torch.arange(pages), None, max_programs)
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
) -> None:
    """Write page ``p``'s checksums into ``store[rows[p], :]`` (asynchronous on CUDA: on the
    current stream).

    ``store`` : int64 ``[R, layers]`` CPU tensor, pinned when the layers are on CUDA.
    ``rows`` : int64 ``[pages]`` CPU tensor in ``[0, R)``; with a repeated row, which page's
    checksum lands there is unspecified.
    """
    geo = _check_layers(layers)
    pages = _check_indices(geo, indices, page_size)
    _check_store(geo, store, rows, pages)
    if _backend(geo, backend, max_programs) == "reference":
        store[rows] = _reference(geo, layers, indices, page_size).to(store.device)
    else:
        _launch(geo, layers, indices, page_size, store, rows, None, max_programs)


def verify_page_checksums(
    layers: Sequence[Sequence[torch.Tensor]],
    indices: torch.Tensor,
    page_size: int,
    store: torch.Tensor,
    rows: torch.Tensor,
    *,
    backend: str | None = None,
    max_programs: int = DEFAULT_PROGRAMS,
) -> torch.Tensor:
    """int64 ``[2]`` on the layers' device: (first page whose checksum differs from
    ``store[rows[p], :]`` in some layer, or ``pages`` when none; how many pages differ).
    Asynchronous on CUDA (current stream); ``store``/``rows`` as :func:`record_page_checksums`."""
    geo = _check_layers(layers)
    pages = _check_indices(geo, indices, page_size)
    _check_store(geo, store, rows, pages)
    if _backend(geo, backend, max_programs) == "reference":
        expected = store[rows].to(geo.device)
        bad = (_reference(geo, layers, indices, page_size) != expected).any(1)
    else:
        flags = torch.zeros(pages * geo.layers, dtype=torch.int8, device=geo.device)
        _launch(geo, layers, indices, page_size, store, rows, flags, max_programs)
        bad = flags.view(pages, geo.layers).any(1)
    count = bad.sum()
    first = bad.to(torch.int8).argmax() if pages else count
    return torch.stack([torch.where(count > 0, first, pages), count])
