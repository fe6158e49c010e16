"""SWAKVPool: full-attention and sliding-window layers' KV in two pools of their own sizes."""

from __future__ import annotations

from typing import Any

import torch

from hicache import env
from hicache.checks import check_int, check_unsupported_flag
from hicache.pools.composite_pool import CompositeKVPool, check_layer_ids
from hicache.pools.device_pool import KVPool
from hicache.pools.mha_pool import MHATokenToKVPool

GB = 1024**3
_SWA_ONLY_KWARGS = ("swa_head_num", "swa_head_dim", "swa_v_head_dim")
BufInfos = tuple[list[int], list[int], list[int]]


def _kv_pool_class(name: str, cls: Any) -> type[KVPool]:
    if not (isinstance(cls, type) and issubclass(cls, KVPool)):
        raise TypeError(f"{name} must be a KVPool subclass, got {cls!r}")
    return cls


def _split_size(size: int | tuple[int, int]) -> tuple[int, int]:
    """An inner pool's ``get_kv_size_bytes()`` as ``(k, v)``: MLA pools give one int."""
    return size if isinstance(size, tuple) else (size, 0)


def _layer_lists(swa_layer_ids: Any, full_layer_ids: Any) -> tuple[list[int], list[int]]:
    swa_ids = check_layer_ids("swa_attention_layer_ids", swa_layer_ids)
    full_ids = check_layer_ids("full_attention_layer_ids", full_layer_ids)
    if set(swa_ids) & set(full_ids):
        raise ValueError(
            "swa_attention_layer_ids and full_attention_layer_ids must be disjoint, both hold "
            f"{sorted(set(swa_ids) & set(full_ids))}"
        )
    return swa_ids, full_ids


class SWAKVPool(CompositeKVPool):
    """KV of a sliding-window model: full-attention layers in ``full_kv_pool`` (``size`` slots),
    sliding-window layers in ``swa_kv_pool`` (``size_swa`` slots).

    Slots handed out by the allocator are full-pool slots; ``full_to_swa_index_mapping``
    (registered by ``SWATokenToKVPoolAllocator``: int64 on ``device``, ``size + page_size + 1``
    entries, the last ``-1`` so that ``-1`` maps to ``-1``, 0 meaning "no SWA slot") maps them
    to SWA-pool slots. SWA layers' getters return the SWA pool's buffers, which the attention
    backend indexes with translated slots.

    Parameters
    ----------
    size, size_swa : usable slots of the full and the SWA pool (page multiples).
    page_size, dtype, head_num, head_dim, device : given to both inner pools.
    swa_attention_layer_ids, full_attention_layer_ids : the model's global layer ids of each
        kind (non-empty, disjoint).
    token_to_kv_pool_class : inner pool class of both (``MHATokenToKVPool``); an MLA class
        needs ``full_kv_pool_kwargs`` / ``swa_kv_pool_kwargs``.
    full_kv_pool_class, swa_kv_pool_class : per-side classes overriding it (SGLang 0.5.23).
    full_kv_pool_kwargs, swa_kv_pool_kwargs : each side's keywords besides ``size``, ``dtype``
        and ``layer_num``, replacing the default ``page_size, head_num, head_dim, device,
        **kwargs`` (the full side drops ``swa_head_num``, ``swa_head_dim``, ``swa_v_head_dim``).
    enable_kvcache_transpose : SGLang 0.5.9's flag, which it asserts False: only False.
    **kwargs : forwarded to both inner constructors (``enable_memory_saver=False`` included).
    """

    def __init__(
        self,
        size: int,
        size_swa: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        swa_attention_layer_ids: list[int],
        full_attention_layer_ids: list[int],
        device: torch.device | str,
        token_to_kv_pool_class: type[KVPool] = MHATokenToKVPool,
        full_kv_pool_class: type[KVPool] | None = None,
        swa_kv_pool_class: type[KVPool] | None = None,
        full_kv_pool_kwargs: dict[str, Any] | None = None,
        swa_kv_pool_kwargs: dict[str, Any] | None = None,
        enable_kvcache_transpose: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        check_unsupported_flag("enable_kvcache_transpose", enable_kvcache_transpose)
        check_int("size_swa", size_swa, minimum=1)
        if {"start_layer", "end_layer"} & set(kwargs):
            raise ValueError("start_layer/end_layer are not taken: layer ids here are global")
        swa_ids, full_ids = _layer_lists(swa_attention_layer_ids, full_attention_layer_ids)
        default_cls = token_to_kv_pool_class
        full_cls = _kv_pool_class("full_kv_pool_class", full_kv_pool_class or default_cls)
        swa_cls = _kv_pool_class("swa_kv_pool_class", swa_kv_pool_class or default_cls)
        common: dict[str, Any] = {"page_size": page_size, "head_num": head_num}
        common |= {"head_dim": head_dim, "device": device, **kwargs}
        if full_kv_pool_kwargs is None:
            full_kv_pool_kwargs = {k: v for k, v in common.items() if k not in _SWA_ONLY_KWARGS}
        full = full_cls(size=size, dtype=dtype, layer_num=len(full_ids), **full_kv_pool_kwargs)
        swa_kwargs = common if swa_kv_pool_kwargs is None else swa_kv_pool_kwargs
        swa = swa_cls(size=size_swa, dtype=dtype, layer_num=len(swa_ids), **swa_kwargs)
        if (swa.page_size, swa.device) != (full.page_size, full.device):
            raise ValueError(
                "full_kv_pool_kwargs and swa_kv_pool_kwargs must agree on page_size and device"
            )
        self.full_kv_pool, self.swa_kv_pool = full, swa
        self.size, self.size_swa, self.dtype = size, size_swa, dtype
        self.page_size = self.full_kv_pool.page_size
        self.head_num, self.head_dim = head_num, head_dim
        self.device = self.full_kv_pool.device
        self.full_layer_nums, self.swa_layer_nums = len(full_ids), len(swa_ids)
        self.layer_num = self.full_layer_nums + self.swa_layer_nums
        self.layers_mapping = {g: (i, False) for i, g in enumerate(full_ids)}
        self.layers_mapping |= {g: (i, True) for i, g in enumerate(swa_ids)}
        self.full_to_swa_index_mapping: torch.Tensor | None = None

    @property
    def inner_pools(self) -> list[KVPool]:
        return [self.full_kv_pool, self.swa_kv_pool]

    def _pool_for(self, is_swa: bool) -> KVPool:
        return self.swa_kv_pool if is_swa else self.full_kv_pool

    def _layer_kind(self) -> str:
        return "full or sliding-window attention layers"

    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        """Use ``full_to_swa_index_mapping`` (int64, 1-D, ``size + page_size + 1`` entries, on
        ``device``; kept by reference, the allocator updates it in place) for translations."""
        mapping = full_to_swa_index_mapping
        name = "full_to_swa_index_mapping"
        if not isinstance(mapping, torch.Tensor) or mapping.dtype != torch.int64:
            raise TypeError(f"{name} must be an int64 tensor, got {mapping!r:.60}")
        expected = (self.size + self.page_size + 1,)
        if tuple(mapping.shape) != expected:
            raise ValueError(f"{name} must have shape {expected}, got {tuple(mapping.shape)}")
        if mapping.device != self.device:
            raise ValueError(f"{name} must be on {self.device}, got {mapping.device}")
        self.full_to_swa_index_mapping = mapping

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """SWA-pool slots (int32, as SGLang up to 0.5.9 and what attention kernels index with;
        shape and device of ``kv_indices``) of full-pool slots ``kv_indices`` (int32/int64 in
        ``[-1, size + page_size)``; ``-1`` maps to ``-1``, a slot without an SWA slot to 0, the
        padding slot). ``ValueError`` before a mapping is registered."""
        return self._translate("kv_indices", kv_indices).to(torch.int32)

    def inner_slots(self, indices: torch.Tensor) -> list[torch.Tensor]:
        """``[indices, their SWA slots]`` (int64, on ``indices``' device): the mapping read
        when called, in the current stream's order; a token without an SWA slot maps to 0, the
        padding slot. CPU indices of a CUDA pool are translated there and read back (the CPU
        waits for the current stream). ``ValueError`` before a mapping is registered."""
        swa = self._translate("indices", indices.to(self.device, non_blocking=True))
        return [indices, swa.to(indices.device)]

    def _translate(self, name: str, indices: Any) -> torch.Tensor:
        mapping = self.full_to_swa_index_mapping
        if mapping is None:
            raise ValueError(
                "no full_to_swa_index_mapping is registered: build a SWATokenToKVPoolAllocator "
                "on this pool (or call register_mapping) first"
            )
        if not isinstance(indices, torch.Tensor) or indices.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be an int32/int64 tensor, got {indices!r:.60}")
        if indices.device != mapping.device:
            raise ValueError(f"{name} must be on {mapping.device}, got {indices.device}")
        if indices.numel() and (indices.device.type == "cpu" or env.device_indices_checked()):
            low, high = (int(v) for v in torch.aminmax(indices))
            if low < -1 or high >= mapping.numel() - 1:
                raise ValueError(
                    f"{name} must lie in [-1, {mapping.numel() - 1}), got values in [{low}, {high}]"
                )
        return mapping[indices]

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        *caches: torch.Tensor,
        swa_loc: torch.Tensor | None = None,
    ) -> None:
        """Write ``caches`` (the inner pool's: ``cache_k, cache_v`` for MHA) for full-pool slots
        ``loc`` of global layer ``layer_id``. A sliding-window layer writes at ``swa_loc`` when
        given (the translation done once per batch, SGLang 0.5.23), else at
        ``translate_loc_from_full_to_swa(loc)`` (0.5.9). Every check precedes the write."""
        pool, index, is_swa = self._route(layer_id)
        if is_swa:
            loc = swa_loc if swa_loc is not None else self._translate("loc", loc)
        pool.set_kv_buffer(index, loc, *caches)

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """``(k bytes, v bytes)`` of both pools' buffers (an MLA side counts as K)."""
        k_full, v_full = _split_size(self.full_kv_pool.get_kv_size_bytes())
        k_swa, v_swa = _split_size(self.swa_kv_pool.get_kv_size_bytes())
        return k_full + k_swa, v_full + v_swa

    @property
    def mem_usage(self) -> float:
        """GB (2**30 bytes) of both pools' KV buffers, as SGLang logs it."""
        return sum(self.get_kv_size_bytes()) / GB

    def get_contiguous_buf_infos(self) -> BufInfos:
        """The full pool's ``(data_ptrs, data_lens, item_lens)`` (SGLang: the KV a transfer
        engine registers; the SWA pool's are the "state" buffers)."""
        return self.full_kv_pool.get_contiguous_buf_infos()

    def get_state_buf_infos(self) -> BufInfos:
        """The SWA pool's ``get_contiguous_buf_infos()``."""
        return self.swa_kv_pool.get_contiguous_buf_infos()

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Move full-pool slots ``src_loc`` to ``tgt_loc`` in both pools (SWA slots through the
        mapping; tokens without an SWA slot move the padding slot). Checks precede moves."""
        tgt_swa = self._translate("tgt_loc", tgt_loc)
        src_swa = self._translate("src_loc", src_loc)
        self.full_kv_pool.move_kv_cache(tgt_loc, src_loc)
        self.swa_kv_pool.move_kv_cache(tgt_swa, src_swa)

    def get_cpu_copy(self, indices: torch.Tensor) -> dict[str, Any]:
        """CPU copies of full-pool slots ``indices``: ``{"full": the full pool's copy, "swa":
        the SWA pool's copy of the tokens that have an SWA slot (None when none has, or no
        mapping is registered), "swa_mask": which tokens those are (bool, CPU, or None)}``."""
        full = self.full_kv_pool.get_cpu_copy(indices)
        if self.full_to_swa_index_mapping is None:
            return {"full": full, "swa": None, "swa_mask": None}
        swa = self._translate("indices", indices)
        mask = swa > 0
        swa_copy = self.swa_kv_pool.get_cpu_copy(swa[mask]) if bool(mask.any()) else None
        return {"full": full, "swa": swa_copy, "swa_mask": mask.cpu()}

    def load_cpu_copy(self, kv_cache_cpu: dict[str, Any], indices: torch.Tensor) -> None:
        """Write back a :meth:`get_cpu_copy` at new full-pool slots ``indices`` (as many): the
        SWA rows at the SWA slots ``indices`` map to now. ``ValueError`` before any write when
        a token that had an SWA slot has none now, or ``kv_cache_cpu`` is not such a copy."""
        swa_loc = self._swa_load_slots(kv_cache_cpu, indices)
        full_chunks = self.full_kv_pool.check_cpu_copy(kv_cache_cpu["full"], indices)
        swa_chunks = None
        if swa_loc is not None:
            swa_chunks = self.swa_kv_pool.check_cpu_copy(kv_cache_cpu["swa"], swa_loc)
        self.full_kv_pool.write_cpu_copy(kv_cache_cpu["full"], full_chunks)
        if swa_chunks is not None:
            self.swa_kv_pool.write_cpu_copy(kv_cache_cpu["swa"], swa_chunks)

    def _swa_load_slots(self, kv_cache_cpu: Any, indices: torch.Tensor) -> torch.Tensor | None:
        if not isinstance(kv_cache_cpu, dict) or set(kv_cache_cpu) != {"full", "swa", "swa_mask"}:
            raise ValueError("kv_cache_cpu must be what get_cpu_copy returns")
        mask = kv_cache_cpu["swa_mask"]
        if kv_cache_cpu["swa"] is None:
            return None
        swa = self._translate("indices", indices)
        if not isinstance(mask, torch.Tensor) or mask.shape != indices.shape:
            raise ValueError(f"kv_cache_cpu's swa_mask must have shape {tuple(indices.shape)}")
        swa = swa[mask.to(swa.device)]
        if not bool((swa > 0).all()):
            raise ValueError("indices: a token that had an SWA slot has none now")
        return swa
