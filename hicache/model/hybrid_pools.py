"""The pools a model of any layer pattern reads, composed as SGLang composes them.

- every layer ``F`` (or every layer ``S``): one ``MHATokenToKVPool`` / ``MLATokenToKVPool``
  (an all-``S`` model keeps its windows in the plain pool, as SGLang's pure-SWA models do);
- ``F`` and ``S`` layers: an ``SWAKVPool`` (``S`` layers in its own, possibly smaller, pool)
  with a ``SWATokenToKVPoolAllocator``;
- attention beside ``L`` layers, no ``S``/``F`` mix: a ``HybridLinearKVPool`` over the
  attention layers;
- ``L`` layers: their conv and temporal states in the ``MambaPool`` of a
  ``HybridReqToTokenPool``, one state slot per request row; no KV pool when every layer is ``L``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hicache.model.config import ModelConfig
from hicache.model.kv import make_kv_pool
from hicache.model.shard import TPShard
from hicache.pools import (
    HybridLinearKVPool,
    HybridReqToTokenPool,
    MambaPool,
    MambaStateParams,
    MLATokenToKVPool,
    ReqToTokenPool,
    SWAKVPool,
    SWATokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)


@dataclass(frozen=True)
class ModelPools:
    """What ``TinyTransformer.forward`` reads and the slots behind it.

    Attributes
    ----------
    kv : the attention layers' KV pool (``forward``'s ``pool``), None when every layer is ``L``.
    allocator : hands out token slots of ``kv`` (an ``SWATokenToKVPoolAllocator`` for an
        ``SWAKVPool``; without ``kv`` it only numbers tokens).
    req_to_token : request rows; a ``HybridReqToTokenPool`` (``forward``'s ``states``) when the
        model has ``L`` layers.
    """

    kv: Any
    allocator: TokenToKVPoolAllocator | SWATokenToKVPoolAllocator
    req_to_token: ReqToTokenPool

    @property
    def states(self) -> HybridReqToTokenPool | None:
        """``req_to_token`` when it holds state slots, else None."""
        pool = self.req_to_token
        return pool if isinstance(pool, HybridReqToTokenPool) else None


def state_params(cfg: ModelConfig, shard: TPShard | None = None) -> MambaStateParams:
    """The recurrent state of ``cfg``'s ``L`` layers as ``shard`` holds it: per layer a conv
    state ``[d, conv_kernel - 1]`` (``cfg.dtype``, ``d`` the shard's channels) and a temporal
    state ``[heads, head_dim, linear_state_size]`` (fp32). ``ValueError`` without ``L`` layers."""
    heads = cfg.num_heads // (shard or TPShard()).size
    return MambaStateParams(
        layers=cfg.layers_of("L"),
        conv=[(heads * cfg.head_dim, cfg.conv_kernel - 1)],
        temporal=(heads, cfg.head_dim, cfg.linear_state_size),
        conv_dtype=cfg.dtype,
        temporal_dtype=torch.float32,
    )


def make_model_pools(
    cfg: ModelConfig,
    size: int,
    page_size: int,
    device: torch.device | str,
    rows: int,
    *,
    swa_size: int | None = None,
    state_slots: int | None = None,
    shard: TPShard | None = None,
    max_context_len: int | None = None,
    enable_mamba_extra_buffer: bool = False,
) -> ModelPools:
    """Fresh pools for ``cfg``'s layer pattern (module docstring), as ``shard`` holds them.

    Parameters
    ----------
    size : token slots of the full-attention pool (a multiple of ``page_size``).
    rows : request rows.
    swa_size : token slots of the SWA pool (default ``size``); used with ``F`` and ``S`` layers.
    state_slots : ``MambaPool`` slots (default ``rows``), for requests and checkpoints.
    max_context_len : the longest request a row holds (default ``size``), rounded up to pages.
    enable_mamba_extra_buffer : give each row of a model with ``L`` layers its two ping-pong
        track slots besides its state (``HybridReqToTokenPool``), ``state_slots`` included.
    """
    row_len = size if max_context_len is None else -(-max_context_len // page_size) * page_size
    states = None
    if cfg.layers_of("L"):
        states = HybridReqToTokenPool(
            size=rows,
            mamba_size=rows if state_slots is None else state_slots,
            max_context_len=row_len,
            device=device,
            cache_params=state_params(cfg, shard),
            enable_mamba_extra_buffer=enable_mamba_extra_buffer,
        )
    swa = size if swa_size is None else swa_size
    kv = _kv_pool(cfg, size, swa, page_size, device, shard, states)
    if isinstance(kv, SWAKVPool):
        alloc: Any = SWATokenToKVPoolAllocator(size, kv.size_swa, page_size, device, kv)
    else:
        alloc = TokenToKVPoolAllocator(size, page_size, device, kvcache=kv)
    return ModelPools(kv, alloc, states or ReqToTokenPool(rows, row_len, device))


def _kv_pool(
    cfg: ModelConfig,
    size: int,
    swa_size: int,
    page_size: int,
    device: torch.device | str,
    shard: TPShard | None,
    states: HybridReqToTokenPool | None,
) -> Any:
    full, swa, attention = cfg.layers_of("F"), cfg.layers_of("S"), cfg.layers_of("FS")
    if not attention:
        return None
    heads = (shard or TPShard()).kv_heads(cfg)
    if full and swa:
        return _swa_pool(cfg, size, swa_size, page_size, device, heads)
    if states is None:
        return make_kv_pool(cfg, size, page_size, device, shard)
    mamba: MambaPool = states.mamba_pool
    mla = cfg.attention == "mla"
    return HybridLinearKVPool(
        size,
        cfg.dtype,
        page_size,
        heads,
        cfg.head_dim,
        attention,
        device,
        mamba,
        use_mla=mla,
        kv_lora_rank=cfg.kv_lora_rank if mla else None,
        qk_rope_head_dim=cfg.qk_rope_head_dim if mla else None,
    )


def _swa_pool(
    cfg: ModelConfig, size: int, swa_size: int, page_size: int, device: Any, heads: int
) -> SWAKVPool:
    full, swa = cfg.layers_of("F"), cfg.layers_of("S")
    if cfg.attention != "mla":
        return SWAKVPool(
            size, swa_size, page_size, cfg.dtype, heads, cfg.head_dim, swa, full, device
        )
    dims = {"page_size": page_size, "device": device, "kv_lora_rank": cfg.kv_lora_rank}
    dims["qk_rope_head_dim"] = cfg.qk_rope_head_dim
    return SWAKVPool(
        size,
        swa_size,
        page_size,
        cfg.dtype,
        1,
        cfg.kv_dim,
        swa,
        full,
        device,
        token_to_kv_pool_class=MLATokenToKVPool,
        full_kv_pool_kwargs=dims,
        swa_kv_pool_kwargs=dims,
    )
