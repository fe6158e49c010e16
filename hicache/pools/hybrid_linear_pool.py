"""HybridLinearKVPool: KV of the full-attention layers of a hybrid linear-attention model.

Qwen3-Next, Kimi Linear and Nemotron-H interleave full-attention layers with linear-attention
(Mamba / gated delta) layers. Only the former have KV, kept here in one inner MHA or MLA pool;
the latter keep a per-request recurrent state in ``mamba_pool`` (a ``MambaPool``).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from hicache.checks import check_int, check_unsupported_flag
from hicache.pools.composite_pool import CompositeKVPool, check_layer_ids
from hicache.pools.device_pool import KVPool
from hicache.pools.kv_ops import CpuCopy
from hicache.pools.mha_pool import MHATokenToKVPool
from hicache.pools.mla_pool import MLATokenToKVPool

GB = 1024**3
BufInfos = tuple[list[int], list[int], list[int]]


class StatePool(Protocol):
    """What this pool reads of its ``mamba_pool``."""

    def get_contiguous_buf_infos(self) -> BufInfos: ...

    def get_state_dim_per_tensor(self) -> list[int]: ...


def _check_mamba_pool(mamba_pool: Any, full_ids: list[int]) -> None:
    """``TypeError`` unless ``mamba_pool`` has ``get_contiguous_buf_infos()``; ``ValueError``
    when its linear layers (``cache_params.layers``, where it has them) meet ``full_ids``."""
    if not callable(getattr(mamba_pool, "get_contiguous_buf_infos", None)):
        raise TypeError(
            f"mamba_pool must have get_contiguous_buf_infos(), got {type(mamba_pool).__name__}"
        )
    linear = set(getattr(getattr(mamba_pool, "cache_params", None), "layers", ()))
    if linear & set(full_ids):
        raise ValueError(
            "full_attention_layer_ids must not hold mamba_pool's linear layers, got "
            f"{sorted(linear & set(full_ids))}"
        )


def _full_kv_pool(cls: Any, common: dict[str, Any], layer_num: int, dims: dict[str, Any]) -> KVPool:
    """The inner pool: ``cls`` (default MHA, or MLA when ``dims`` are MLA's) of ``layer_num``."""
    if cls is None:
        cls = MLATokenToKVPool if "kv_lora_rank" in dims else MHATokenToKVPool
    if not (isinstance(cls, type) and issubclass(cls, KVPool)):
        raise TypeError(f"full_kv_pool_class must be a KVPool subclass, got {cls!r}")
    pool: KVPool = cls(**common, layer_num=layer_num, **dims)
    return pool


class HybridLinearKVPool(CompositeKVPool):
    """Full-attention layers' KV in ``full_kv_pool``; linear layers have none.

    Parameters
    ----------
    size, dtype, page_size, device : of ``full_kv_pool``.
    head_num, head_dim : its heads (MHA; unused with ``use_mla``).
    full_attention_layer_ids : the model's global ids of the full-attention layers (non-empty,
        distinct); ``full_attention_layer_id_mapping`` maps each to its index in ``full_kv_pool``.
    mamba_pool : the linear layers' state pool (``HybridReqToTokenPool.mamba_pool``); only its
        ``get_contiguous_buf_infos()`` is used here.
    use_mla, kv_lora_rank, qk_rope_head_dim : an ``MLATokenToKVPool`` of these instead.
    start_layer : first layer of this pipeline stage (getters wait on ``layer_id - start_layer``).
    full_kv_pool_class : the inner pool class (default MHA or MLA by ``use_mla``), built with
        the keywords of that default.
    enable_kvcache_transpose, enable_memory_saver : SGLang's flags, taken for its signature:
        only False.

    A linear layer's id (or any id not in ``full_attention_layer_ids``) given to a getter or
    ``set_kv_buffer`` is a ``ValueError`` naming ``layer_id``. SGLang 0.5.23's DSA,
    quantisation and shared-pool keywords are not taken.
    """

    def __init__(
        self,
        size: int,
        dtype: torch.dtype,
        page_size: int,
        head_num: int,
        head_dim: int,
        full_attention_layer_ids: list[int],
        device: torch.device | str,
        mamba_pool: StatePool,
        use_mla: bool = False,
        kv_lora_rank: int | None = None,
        qk_rope_head_dim: int | None = None,
        start_layer: int | None = None,
        full_kv_pool_class: type[KVPool] | None = None,
        enable_kvcache_transpose: bool = False,
        enable_memory_saver: bool = False,
    ) -> None:
        super().__init__(0 if start_layer is None else check_int("start_layer", start_layer))
        check_unsupported_flag("enable_kvcache_transpose", enable_kvcache_transpose)
        check_unsupported_flag("enable_memory_saver", enable_memory_saver)
        full_ids = check_layer_ids("full_attention_layer_ids", full_attention_layer_ids)
        _check_mamba_pool(mamba_pool, full_ids)
        if not isinstance(use_mla, bool):
            raise TypeError(f"use_mla must be a bool, got {type(use_mla).__name__}")
        self.full_kv_pool = _full_kv_pool(
            full_kv_pool_class,
            {"size": size, "page_size": page_size, "dtype": dtype, "device": device},
            len(full_ids),
            {"kv_lora_rank": kv_lora_rank, "qk_rope_head_dim": qk_rope_head_dim}
            if use_mla
            else {"head_num": head_num, "head_dim": head_dim},
        )
        self.size, self.dtype, self.page_size = size, dtype, self.full_kv_pool.page_size
        self.device = self.full_kv_pool.device
        self.head_num, self.head_dim = head_num, head_dim
        self.use_mla = use_mla
        self.mamba_pool = mamba_pool
        self.full_layer_nums = len(full_ids)
        self.full_attention_layer_id_mapping = {g: i for i, g in enumerate(full_ids)}
        self.layers_mapping = {g: (i, False) for i, g in enumerate(full_ids)}

    @property
    def inner_pools(self) -> list[KVPool]:
        return [self.full_kv_pool]

    def _pool_for(self, is_swa: bool) -> KVPool:
        return self.full_kv_pool

    def _layer_kind(self) -> str:
        return "full-attention layers (linear layers keep their state in mamba_pool)"

    def _other_layers(self) -> tuple[int, ...]:
        """``mamba_pool``'s linear layers (``cache_params.layers``, where it has them)."""
        return tuple(getattr(getattr(self.mamba_pool, "cache_params", None), "layers", ()))

    def get_kv_size_bytes(self) -> Any:
        """``full_kv_pool.get_kv_size_bytes()``: ``(k, v)`` bytes for MHA, one int for MLA."""
        return self.full_kv_pool.get_kv_size_bytes()

    @property
    def mem_usage(self) -> float:
        """GB (2**30 bytes) of the KV buffers, as SGLang logs it."""
        size = self.get_kv_size_bytes()
        return (sum(size) if isinstance(size, tuple) else size) / GB

    def get_contiguous_buf_infos(self) -> BufInfos:
        """``full_kv_pool``'s ``(data_ptrs, data_lens, item_lens)``."""
        return self.full_kv_pool.get_contiguous_buf_infos()

    def get_state_buf_infos(self) -> BufInfos:
        """``mamba_pool.get_contiguous_buf_infos()``: the linear layers' state buffers."""
        return self.mamba_pool.get_contiguous_buf_infos()

    def get_state_dim_per_tensor(self) -> list[int]:
        """``mamba_pool.get_state_dim_per_tensor()``: the tensor-parallel sliceable dim of each
        entry of :meth:`get_state_buf_infos`."""
        return self.mamba_pool.get_state_dim_per_tensor()

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """``full_kv_pool.move_kv_cache(tgt_loc, src_loc)`` (mamba states are per request)."""
        self.full_kv_pool.move_kv_cache(tgt_loc, src_loc)

    def get_cpu_copy(self, indices: torch.Tensor) -> CpuCopy:
        """``full_kv_pool.get_cpu_copy(indices)`` (SGLang 0.5.23's mamba part is not taken)."""
        return self.full_kv_pool.get_cpu_copy(indices)

    def load_cpu_copy(self, kv_cache_cpu: CpuCopy, indices: torch.Tensor) -> None:
        """``full_kv_pool.load_cpu_copy(kv_cache_cpu, indices)``."""
        self.full_kv_pool.load_cpu_copy(kv_cache_cpu, indices)
