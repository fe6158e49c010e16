"""The NSA indexer's key cache layout (SGLang's): FP8 index keys, then their fp32 scales, per page.

One layer's buffer is ``[num_pages, page_size * (head_dim + scale_bytes)]`` uint8. Page ``p``
holds tokens (slots) ``p * page_size + o`` for ``0 <= o < page_size``:

- bytes ``[o * head_dim, (o + 1) * head_dim)``: token ``o``'s FP8 (e4m3) key;
- bytes ``[page_size * head_dim + o * scale_bytes, ... + scale_bytes)``: its fp32 scale(s), one
  per ``QUANT_BLOCK_SIZE`` channels (``scale_bytes = 4`` for the 128-channel index head).

The views below split that row into ``[pages, page_size, head_dim]`` keys and
``[pages, page_size, scale_bytes]`` scales, so token reads and writes are plain indexing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hicache import env
from hicache.checks import check_int

QUANT_BLOCK_SIZE = 128  # channels sharing one fp32 scale
SCALE_ITEM_BYTES = 4  # one fp32 scale


def check_page_indices(page_indices: object, needed: int, num_pages: int) -> torch.Tensor:
    """``page_indices`` if a 1-D int32/int64 tensor of at least ``needed`` pages, the first
    ``needed`` in ``[0, num_pages)``: ``TypeError``/``ValueError``/``IndexError`` naming it (the
    range on CPU tensors, on CUDA ones only with ``HICACHE_CHECK_DEVICE_INDICES``)."""
    if not isinstance(page_indices, torch.Tensor):
        raise TypeError(f"page_indices must be a torch.Tensor, got {type(page_indices).__name__}")
    if page_indices.dtype not in (torch.int32, torch.int64) or page_indices.dim() != 1:
        raise TypeError(
            "page_indices must be a 1-D int32 or int64 tensor, "
            f"got {page_indices.dtype} {tuple(page_indices.shape)}"
        )
    if page_indices.numel() < needed:
        raise ValueError(
            f"page_indices must hold at least {needed} pages, got {page_indices.numel()}"
        )
    used = page_indices[:needed]
    if needed == 0 or (used.device.type != "cpu" and not env.device_indices_checked()):
        return page_indices
    low, high = (int(v) for v in torch.aminmax(used))
    if low < 0 or high >= num_pages:
        raise IndexError(
            f"page_indices must lie in [0, {num_pages}), got values in [{low}, {high}]"
        )
    return page_indices


@dataclass(frozen=True)
class IndexKLayout:
    """The byte layout of one layer's index-K buffer (module docstring)."""

    page_size: int
    head_dim: int

    def __post_init__(self) -> None:
        check_int("page_size", self.page_size, minimum=1)
        check_int("index_head_dim", self.head_dim, minimum=QUANT_BLOCK_SIZE)
        if self.head_dim % QUANT_BLOCK_SIZE:
            raise ValueError(
                f"index_head_dim must be a multiple of {QUANT_BLOCK_SIZE}, got {self.head_dim}"
            )

    @property
    def scale_bytes(self) -> int:
        """Bytes of one token's scales."""
        return self.head_dim // QUANT_BLOCK_SIZE * SCALE_ITEM_BYTES

    @property
    def key_bytes(self) -> int:
        """Bytes of one page's keys (where its scales start)."""
        return self.page_size * self.head_dim

    @property
    def row_bytes(self) -> int:
        """Bytes of one page: its keys, then its scales."""
        return self.page_size * (self.head_dim + self.scale_bytes)

    def new_buffer(self, num_pages: int, device: torch.device) -> torch.Tensor:
        """A zeroed ``[num_pages, row_bytes]`` uint8 buffer on ``device``."""
        return torch.zeros((num_pages, self.row_bytes), dtype=torch.uint8, device=device)

    def keys(self, buf: torch.Tensor) -> torch.Tensor:
        """View ``[pages, page_size, head_dim]`` uint8 of ``buf``'s keys."""
        view: torch.Tensor = buf[:, : self.key_bytes].unflatten(1, (self.page_size, self.head_dim))
        return view

    def scales(self, buf: torch.Tensor) -> torch.Tensor:
        """View ``[pages, page_size, scale_bytes]`` uint8 of ``buf``'s scales."""
        view: torch.Tensor = buf[:, self.key_bytes :].unflatten(
            1, (self.page_size, self.scale_bytes)
        )
        return view

    def split(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(page, offset)`` int64 of each slot of ``slots`` (int, any shape)."""
        slots = slots.long()
        return slots // self.page_size, slots % self.page_size

    def sequence(self, page_indices: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, ...]:
        """``(page, offset)`` of tokens ``0 .. seq_len - 1`` of a sequence whose ``i``-th page is
        ``page_indices[i]`` (each ``[seq_len]`` int64 on ``page_indices``' device)."""
        token = torch.arange(seq_len, device=page_indices.device)
        return page_indices.long()[token // self.page_size], token % self.page_size

    def read(self, buf: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of slots ``slots``' (``[n]``) keys ``[n, head_dim]`` and scales ``[n,
        scale_bytes]``, uint8 on ``buf``'s device."""
        page, offset = self.split(slots)
        return self.keys(buf)[page, offset], self.scales(buf)[page, offset]

    def write(
        self, buf: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor, scales: torch.Tensor
    ) -> None:
        """Store ``keys`` (``[n, head_dim]`` uint8) and ``scales`` (``[n, scale_bytes]`` uint8)
        as slots ``slots`` (``[n]``) of ``buf``."""
        page, offset = self.split(slots)
        self.keys(buf)[page, offset] = keys
        self.scales(buf)[page, offset] = scales

    def move(self, buf: torch.Tensor, tgt: torch.Tensor, src: torch.Tensor) -> None:
        """Copy slots ``src`` to slots ``tgt`` (both ``[n]``) within ``buf``, keys and scales;
        the other tokens of their pages are left alone."""
        tgt_page, tgt_offset = self.split(tgt)
        src_page, src_offset = self.split(src)
        for view in (self.keys(buf), self.scales(buf)):
            view[tgt_page, tgt_offset] = view[src_page, src_offset]
