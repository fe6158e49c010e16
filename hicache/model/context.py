"""What one forward pass's layers read besides their weights: the pools and per-batch plans.

Built once per forward (no per-layer planning): sliding-window layers get their windows'
segments and the SWA slots of the new tokens, linear layers the state slot of each request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hicache.devices import to_device
from hicache.model.batch import ForwardBatch, KVGather, Segment, attend
from hicache.model.config import ModelConfig
from hicache.model.window import window_segments
from hicache.pools import HybridReqToTokenPool, SWAKVPool
from hicache.pools.composite_pool import LayerKVPool
from hicache.pools.mamba_state import MambaState


@dataclass(frozen=True)
class ForwardContext:
    """One batch with the pools its layers use.

    Attributes
    ----------
    batch : the batch.
    kv : the attention layers' KV pool (layer ids global): an ``MHATokenToKVPool`` /
        ``MLATokenToKVPool``, an ``SWAKVPool`` (``F`` and ``S`` layers), a
        ``HybridLinearKVPool`` (attention beside ``L`` layers); None without attention layers.
    states : the ``HybridReqToTokenPool`` whose state slots ``L`` layers use, or None.
    windows : ``S`` layers' segments (:func:`window_segments`), or None.
    swa_loc : ``[T]`` int64 SWA slots of the new tokens when ``kv`` is an ``SWAKVPool``.
    state_slots : ``[B]`` int64 state slot of each request (``L`` layers), or None.
    """

    batch: ForwardBatch
    kv: Any
    states: HybridReqToTokenPool | None
    windows: tuple[Segment, ...] | None
    swa_loc: torch.Tensor | None
    state_slots: torch.Tensor | None

    @classmethod
    def build(cls, cfg: ModelConfig, batch: ForwardBatch, kv: Any, states: Any) -> ForwardContext:
        """``ValueError`` naming ``pool`` / ``states`` when ``cfg``'s layers need one that is
        missing, or ``states`` is not a ``HybridReqToTokenPool``."""
        kinds = cfg.layer_kinds
        if kv is None and ("F" in kinds or "S" in kinds):
            raise ValueError("pool: attention layers need a KV pool, got None")
        if "L" in kinds and not isinstance(states, HybridReqToTokenPool):
            raise ValueError(
                "states: linear (L) layers need a HybridReqToTokenPool, "
                f"got {type(states).__name__}"
            )
        windows = swa_loc = None
        if "S" in kinds:
            to_pool = _slot_map(kv)
            windows = window_segments(batch, cfg.sliding_window, to_pool)
            swa_loc = to_pool(batch.out_cache_loc) if isinstance(kv, SWAKVPool) else None
        slots = _state_slots(batch, states) if "L" in kinds else None
        return cls(batch, kv, states if "L" in kinds else None, windows, swa_loc, slots)

    def kv_pool(self) -> LayerKVPool:
        assert self.kv is not None, "checked by build for models with attention layers"
        pool: LayerKVPool = self.kv
        return pool

    def write_kv(self, layer_id: int, window: bool, *caches: torch.Tensor) -> None:
        """Store the new tokens' ``caches`` (the pool's: ``k, v`` or MLA's latent) of layer
        ``layer_id``; a sliding-window layer of an ``SWAKVPool`` at :attr:`swa_loc`."""
        loc = self.batch.out_cache_loc
        if window and self.swa_loc is not None:
            self.kv.set_kv_buffer(layer_id, loc, *caches, swa_loc=self.swa_loc)
        else:
            self.kv.set_kv_buffer(layer_id, loc, *caches)

    def attend(self, window: bool, q: torch.Tensor, gather: KVGather, scale: float) -> torch.Tensor:
        """:func:`hicache.model.batch.attend` over the batch's segments (full attention) or
        :attr:`windows` (``window``)."""
        if not window:
            return self.batch.attend(q, gather, scale)
        assert self.windows is not None, "built for models with S layers"
        return attend(self.windows, q, gather, scale)

    def layer_state(self, layer_id: int) -> MambaState:
        """Linear layer ``layer_id``'s state (views ``[slots, ...]``), once loaded."""
        assert self.states is not None, "checked by build for models with L layers"
        return self.states.mamba2_layer_cache(layer_id)


def _slot_map(kv: Any) -> Any:
    """Full-pool slots -> the slots sliding-window layers read (int64)."""
    if isinstance(kv, SWAKVPool):
        return lambda slots: kv.translate_loc_from_full_to_swa(slots).long()
    return lambda slots: slots


def _state_slots(batch: ForwardBatch, states: HybridReqToTokenPool) -> torch.Tensor:
    rows = torch.tensor(batch.req_pool_indices, dtype=torch.int64)
    if rows.numel() != len(batch.segments):
        raise ValueError("batch: linear layers need req_pool_indices (ForwardBatch.build)")
    on = batch.input_ids.device
    return states.get_mamba_indices(to_device(rows, on)).long()
