"""A hybrid model's real pools under a HybridHiRadixCache (device and host tiers), with the
KV and state contents a test writes and reads back."""

from __future__ import annotations

from typing import Any

import torch

from hicache.model import ModelConfig
from hicache.model.hybrid_pools import make_model_pools
from hicache.radix import RadixKey
from hicache.radix.components import CheckpointPolicy, HybridConfig
from hicache.tiers.hybrid_hiradix_cache import HybridHiRadixCache
from tests.radix.hybrid_rig import HybridReq


class HybridHostRig:
    """A ``pattern`` model's pools (``pages`` pages, 4 rows) and a two-tier hybrid cache."""

    def __init__(
        self,
        pattern: str = "FSL",
        window: int = 4,
        page_size: int = 1,
        pages: int = 64,
        state_slots: int = 8,
        swa_pages: int | None = None,
        **settings: object,
    ) -> None:
        self.cfg = ModelConfig(
            num_layers=len(pattern), layer_pattern=pattern, sliding_window=window
        )
        self.pattern, self.page_size = pattern, page_size
        size = pages * page_size
        swa = None if swa_pages is None else swa_pages * page_size
        self.pools = make_model_pools(
            self.cfg, size, page_size, "cpu", 4, swa_size=swa, state_slots=state_slots
        )
        hybrid = HybridConfig(
            window if "S" in pattern else None, "L" in pattern, CheckpointPolicy()
        )
        self.cache = HybridHiRadixCache(
            self.pools.req_to_token,
            self.pools.allocator,
            page_size,
            hybrid=hybrid,
            **settings,
        )
        self.gen = torch.Generator().manual_seed(7)

    @property
    def state_pool(self):
        return self.cache.components.state_pool

    def has_state_room(self) -> bool:
        return self.state_pool is None or self.state_pool.available_size() > 0

    def attention_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.pattern) if kind in "FS"]

    def write_kv(
        self, slots: torch.Tensor, codes: list[float] | None = None
    ) -> dict[int, torch.Tensor]:
        """Keys at ``slots`` of every attention layer, random or each token's ``codes`` value
        (plus its layer) everywhere; returns them by layer."""
        kv = self.pools.kv
        written = {}
        for layer in self.attention_layers():
            shape = (len(slots), *kv.get_key_buffer(layer)[0].shape)
            if codes is None:
                k = torch.randn(shape, generator=self.gen).to(self.cfg.dtype)
            else:
                k = (torch.tensor(codes) + layer).view(-1, *[1] * (len(shape) - 1)).expand(shape)
                k = k.to(self.cfg.dtype).contiguous()
            kv.set_kv_buffer(layer, slots, k, k)
            written[layer] = k
        return written

    def read_keys(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        kv = self.pools.kv
        if self.pattern[layer] == "S" and hasattr(kv, "translate_loc_from_full_to_swa"):
            slots = kv.translate_loc_from_full_to_swa(slots)
        return kv.get_key_buffer(layer)[slots]

    def put(
        self, ids: list[int], codes: list[float] | None = None
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor], float]:
        """Insert ``ids`` with fresh slots holding random KV (or ``codes``, one per token, and
        the last code as the state's value) and a state of a random value (a model with linear
        layers); returns the slots, the KV and the state value."""
        slots = self.pools.allocator.alloc(len(ids))
        assert slots is not None
        kv = self.write_kv(slots, codes)
        value = float(torch.rand((), generator=self.gen)) + 1.0 if codes is None else codes[-1]
        state = None
        if self.cache.hybrid.recurrent:
            state = int(self.state_pool.alloc(1)[0])
            for t in self.state_pool.mamba_cache.tensors():
                t[:, state] = value
        present = self.cache.insert(RadixKey(ids), slots, state=state)
        self.pools.allocator.free(slots[:present])  # the duplicates
        self.cache.check_hicache_events()
        return slots, kv, value

    def recompute(self, ids: list[int]) -> tuple[HybridReq, torch.Tensor]:
        """A request that matched ``ids`` (locked) and computed all of them into fresh slots
        holding random KV (an attention-only model): the request and its slots."""
        match = self.cache.match_prefix(RadixKey(ids))
        self.cache.inc_lock_ref(match.last_device_node)
        req = HybridReq(0, list(ids), kv_len=len(ids))
        row = self.pools.req_to_token.alloc(1)[0]
        own = self.pools.allocator.alloc(len(ids))
        assert own is not None and match.device_prefix_len == 0
        self.write_kv(own)
        self.pools.req_to_token.write((row, slice(0, len(ids))), own.to(torch.int32))
        req.req_pool_idx, req.cache_protected_len, req.last_node = row, 0, match.last_device_node
        req.prefix_indices = match.device_indices
        return req, own

    def load(self, ids: list[int]) -> tuple[Any, torch.Tensor, Any]:
        """Match ``ids``, load their host part back and let it land: (match, slots, node)."""
        cache = self.cache
        match = cache.match_prefix(RadixKey(ids))
        slots, node = cache.init_load_back(match.last_host_node, match.host_hit_length)
        cache.consume_load_batch(cache.ready_to_load_host_cache())
        cache.drain_transfers()
        return match, slots, node

    def state_value(self, slot: int) -> float:
        return float(next(iter(self.state_pool.mamba_cache.tensors()))[:, slot].flatten()[0])

    def evict_all(self) -> None:
        self.cache.drain_transfers()
        self.cache.evict(self.cache.evictable_size())

    def check(self) -> None:
        self.cache.check_invariants()
        self.pools.allocator.check_invariants()
