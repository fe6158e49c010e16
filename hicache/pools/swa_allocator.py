"""SWATokenToKVPoolAllocator: slots in both pools of a ``SWAKVPool``, and the map between them."""

from __future__ import annotations

from typing import Any

import torch

from hicache import env
from hicache.checks import check_int
from hicache.devices import canonical_device
from hicache.pools.allocator import TokenToKVPoolAllocator
from hicache.pools.swa_pool import SWAKVPool


class SWATokenToKVPoolAllocator:
    """Allocates each token a full-pool slot and an SWA-pool slot, and maintains
    ``full_to_swa_index_mapping`` (registered on ``kvcache``).

    ``alloc`` returns full-pool slots; their SWA slots are ``translate_loc_from_full_to_swa``.
    ``free_swa`` releases the SWA slots of tokens that left the window (their mapping becomes 0,
    the padding slot); ``free`` releases both (the SWA side only where still mapped).

    Parameters
    ----------
    size, size_swa : usable slots of the full and the SWA pool; ``kvcache`` must have them.
    page_size : slots per page of both pools.
    device : where slots and the mapping live (``kvcache``'s device).
    kvcache : the ``SWAKVPool``.
    dtype, need_sort : SGLang's keywords (keyword-only here), checked and otherwise unused:
        ``dtype`` (None or ``kvcache.dtype``) is the pool's already, and freed pages always
        go back sorted, as SGLang's ``need_sort=True``.

    ``alloc`` hands out whole pages at any ``page_size`` (SGLang's token ``alloc``
    needs ``page_size == 1``; ``alloc_extend`` / ``alloc_decode`` are not provided).
    """

    def __init__(
        self,
        size: int,
        size_swa: int,
        page_size: int,
        device: torch.device | str,
        kvcache: SWAKVPool,
        *,
        dtype: torch.dtype | None = None,
        need_sort: bool = True,
    ) -> None:
        if not isinstance(kvcache, SWAKVPool):
            raise TypeError(f"kvcache must be a SWAKVPool, got {type(kvcache).__name__}")
        if dtype is not None and dtype != kvcache.dtype:
            raise ValueError(f"dtype must be kvcache.dtype={kvcache.dtype}, got {dtype!r}")
        if not isinstance(need_sort, bool):
            raise TypeError(f"need_sort must be a bool, got {type(need_sort).__name__}")
        for name, value in (("size", size), ("size_swa", size_swa), ("page_size", page_size)):
            check_int(name, value, minimum=1)
        theirs = (kvcache.size, kvcache.size_swa, kvcache.page_size)
        if (size, size_swa, page_size) != theirs:
            raise ValueError(
                f"kvcache has (size, size_swa, page_size) = {theirs}; "
                f"the allocator was given {(size, size_swa, page_size)}"
            )
        self.device = canonical_device(device)
        self.page_size = page_size
        self.full_attn_allocator = TokenToKVPoolAllocator(
            size, page_size, self.device, kvcache.full_kv_pool
        )
        self.swa_attn_allocator = TokenToKVPoolAllocator(
            size_swa, page_size, self.device, kvcache.swa_kv_pool
        )
        self.slot_ids = self.full_attn_allocator.slot_ids  # full-pool slot ids, as ``alloc``'s
        # Slot s of the full pool -> its SWA slot (0: none); the trailing -1 maps index -1 to -1.
        self.full_to_swa_index_mapping = torch.zeros(
            size + page_size + 1, dtype=torch.int64, device=self.device
        )
        self.full_to_swa_index_mapping[-1] = -1
        self._kvcache = kvcache
        kvcache.register_mapping(self.full_to_swa_index_mapping)

    @property
    def size(self) -> int:
        """Tokens that fit in both pools: ``min(size_full, size_swa)``."""
        return min(self.size_full, self.size_swa)

    @property
    def size_full(self) -> int:
        return self.full_attn_allocator.size

    @property
    def size_swa(self) -> int:
        return self.swa_attn_allocator.size

    def available_size(self) -> int:
        """Tokens ``alloc`` can take now: the smaller of both pools' free slots."""
        return min(self.full_available_size(), self.swa_available_size())

    def full_available_size(self) -> int:
        return self.full_attn_allocator.available_size()

    def swa_available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    def get_kvcache(self) -> SWAKVPool:
        return self._kvcache

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """``kvcache.translate_loc_from_full_to_swa(kv_indices)``."""
        return self._kvcache.translate_loc_from_full_to_swa(kv_indices)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` full-pool slots (int64 on ``device``, whole pages), each mapped to a
        new SWA slot; None, with nothing allocated, when either pool is short."""
        check_int("need_size", need_size)
        if need_size > self.available_size():
            return None
        full = self.full_attn_allocator.alloc(need_size)
        swa = self.swa_attn_allocator.alloc(need_size)
        assert full is not None and swa is not None, "both checked by available_size"
        self.full_to_swa_index_mapping[full] = swa
        return full

    def free(self, free_index: torch.Tensor) -> None:
        """Free full-pool slots ``free_index`` (the pages holding them) and their SWA slots.

        The checks (int32/int64 1-D tensor, range, repeats, double free) run before any
        change; the SWA slots freed are those the mapping still holds.
        """
        self.full_attn_allocator.free(self._check_full_slots(free_index))
        self._release_swa(self._page_slots(free_index))

    def free_swa(self, free_index: torch.Tensor) -> None:
        """Free the SWA slots of the pages of full-pool slots ``free_index`` (tokens that left
        the window) and map those slots to 0; full slots stay allocated. Slots already without
        an SWA slot are skipped. ``TypeError``/``ValueError`` naming ``free_index`` first."""
        self._release_swa(self._page_slots(self._check_full_slots(free_index)))

    def free_group_begin(self) -> None:
        """Defer both allocators' free-list updates to ``free_group_end``."""
        self.full_attn_allocator.free_group_begin()
        self.swa_attn_allocator.free_group_begin()

    def free_group_end(self) -> None:
        self.full_attn_allocator.free_group_end()
        self.swa_attn_allocator.free_group_end()

    def bind_thread(self) -> None:
        """Make the calling thread the driver of both allocators (``hicache.threads``)."""
        self.full_attn_allocator.bind_thread()
        self.swa_attn_allocator.bind_thread()

    def clear(self) -> None:
        """Every slot of both pools free, every mapping entry 0 (the trailing -1 kept)."""
        self.full_attn_allocator.clear()
        self.swa_attn_allocator.clear()
        self.full_to_swa_index_mapping[:-1] = 0

    def check_invariants(self) -> None:
        """``RuntimeError`` unless both allocators are consistent and the mapped SWA slots are
        exactly the allocated ones, each mapped from one allocated full slot."""
        self.full_attn_allocator.check_invariants()
        self.swa_attn_allocator.check_invariants()
        mapping = self.full_to_swa_index_mapping[:-1].cpu()
        mapped = mapping.nonzero().flatten()
        full_free = self.full_attn_allocator.free_slots()
        if torch.isin(mapped, full_free).any():
            raise RuntimeError("swa allocator: a free full slot is mapped to an SWA slot")
        swa = mapping[mapped]
        swa_free = self.swa_attn_allocator.free_slots()
        if swa.unique().numel() != swa.numel() or torch.isin(swa, swa_free).any():
            raise RuntimeError("swa allocator: an SWA slot is free or mapped twice")
        lo, hi = self.swa_attn_allocator.slot_range
        if swa.numel() != hi - lo - swa_free.numel():
            raise RuntimeError("swa allocator: an allocated SWA slot is mapped from no full slot")

    def _check_full_slots(self, indices: Any) -> torch.Tensor:
        if not isinstance(indices, torch.Tensor) or indices.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"free_index must be an int32/int64 tensor, got {indices!r:.60}")
        if indices.dim() != 1:
            raise ValueError(f"free_index must be 1-D, got shape {tuple(indices.shape)}")
        if indices.numel() and (indices.device.type == "cpu" or env.device_indices_checked()):
            lo, hi = self.full_attn_allocator.slot_range
            low, high = (int(v) for v in torch.aminmax(indices))
            if low < lo or high >= hi:
                raise ValueError(f"free_index must lie in [{lo}, {hi}), got [{low}, {high}]")
        return indices

    def _page_slots(self, indices: torch.Tensor) -> torch.Tensor:
        """Every slot of the pages holding ``indices`` (int64, on the mapping's device)."""
        ps = self.page_size
        pages: torch.Tensor = torch.unique(indices.to(self.device, torch.int64) // ps)
        return (pages[:, None] * ps + torch.arange(ps, device=self.device)).flatten()

    def _release_swa(self, full_slots: torch.Tensor) -> None:
        swa = self.full_to_swa_index_mapping[full_slots]
        self.swa_attn_allocator.free(swa[swa > 0])
        self.full_to_swa_index_mapping[full_slots] = 0
