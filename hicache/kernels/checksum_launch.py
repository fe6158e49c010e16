"""Launch of the page-checksum kernel: tile shape, the layers' pointer table and the grid."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from hicache import env
from hicache.kernels.checksum_kernel import checksum_kernel
from hicache.kernels.checksum_reference import PageGeometry

TILE_WORDS = 2048  # words one program hashes per step: [ROWS, COLS]
_TL_WORDS = {4: (tl.int32, tl.uint32), 2: (tl.int16, tl.uint16), 1: (tl.int8, tl.uint8)}
# pointer tables by (device, addresses); bounded
_TABLES: dict[tuple[torch.device, tuple[int, ...]], torch.Tensor] = {}


def _table(layers: Sequence[Sequence[torch.Tensor]], device: torch.device) -> torch.Tensor:
    """int64 ``[parts * layers]`` of the layers' addresses on ``device`` (cached)."""
    addresses = tuple(t.data_ptr() for part in layers for t in part)
    key = (device, addresses)
    if key not in _TABLES:
        if len(_TABLES) >= 16:
            _TABLES.pop(next(iter(_TABLES)))
        _TABLES[key] = torch.tensor(addresses, dtype=torch.int64, device=device)
    return _TABLES[key]


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
    """Checksum ``indices``' pages into ``store[rows[p], :]``, or with ``flags`` (int8
    ``[pages * layers]`` on the device) set ``flags[p * layers + l]`` where they differ from it;
    ``skip_pad``: a page holding slot 0 records ``NO_SUM`` and is never flagged. Inputs
    validated by :mod:`hicache.kernels.checksum` (``store`` rows may be strided)."""
    assert geo.device.type == "cuda" or env.ENV.triton_interpret, (
        "Triton on CPU tensors needs TRITON_INTERPRET=1 set before triton is imported"
    )
    pages, (word_ty, uword_ty) = rows.numel(), _TL_WORDS[geo.word]
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
        checksum_kernel[grid](
            indices.contiguous(),
            rows_dev,
            _table(layers, geo.device),
            rows_dev if flags is None else flags,
            store.data_ptr(),
            store.stride(0),
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
            SKIP_PAD=skip_pad,
            num_warps=max(1, min(8, tile_rows * cols // 256)),
        )
