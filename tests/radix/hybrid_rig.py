"""Real hybrid-model pools under a HybridRadixCache, and the steps a scheduler takes on them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hicache.model import ModelConfig
from hicache.model.hybrid_pools import make_model_pools
from hicache.radix import RadixKey, Req
from hicache.radix.components import CheckpointPolicy, HybridConfig
from hicache.radix.hybrid_cache import HybridRadixCache


@dataclass(eq=False)
class HybridReq(Req):
    """A ``Req`` with the fields a ``HybridReqToTokenPool`` reads and writes."""

    mamba_pool_idx: torch.Tensor | None = None
    mamba_ping_pong_track_buffer: torch.Tensor | None = None
    mamba_next_track_idx: int | None = None
    mamba_branching_seqlen: int | None = None


class HybridRig:
    """A ``pattern`` model's pools (64 pages, 4 rows, 8 state slots) and its cache."""

    def __init__(
        self,
        pattern: str = "FSL",
        window: int = 4,
        page_size: int = 1,
        policy: CheckpointPolicy | None = None,
        pages: int = 64,
        state_slots: int = 8,
    ) -> None:
        cfg = ModelConfig(num_layers=len(pattern), layer_pattern=pattern, sliding_window=window)
        size = pages * page_size
        self.pools = make_model_pools(cfg, size, page_size, "cpu", 4, state_slots=state_slots)
        hybrid = HybridConfig(
            window if "S" in pattern else None, "L" in pattern, policy or CheckpointPolicy()
        )
        self.page_size = page_size
        self.cache = HybridRadixCache(
            self.pools.req_to_token, self.pools.allocator, page_size, hybrid=hybrid
        )

    @property
    def state_pool(self):
        return self.cache.components.state_pool

    def put(self, ids: list[int], with_state: bool = True) -> int | None:
        """Insert ``ids`` with fresh slots (and a fresh state slot); returns the state slot."""
        present = self.cache.match_prefix(RadixKey(ids)).full_kv_hit_length
        slots = self.pools.allocator.alloc(len(ids))
        assert slots is not None
        state = None
        if with_state and self.cache.hybrid.recurrent:
            state = int(self.state_pool.alloc(1)[0])
        self.cache.insert(RadixKey(ids), slots, state=state)
        self.pools.allocator.free(slots[:present])  # the duplicates
        return state

    def schedule(self, ids: list[int], kv_len: int | None = None) -> HybridReq:
        """match + lock + a row with fresh slots for the uncached rest."""
        match = self.cache.match_prefix(RadixKey(ids))
        self.cache.inc_lock_ref(match.last_device_node)
        prefix = match.device_prefix_len
        req = HybridReq(0, list(ids), kv_len=len(ids) if kv_len is None else kv_len)
        pool = self.pools.req_to_token
        rows = pool.alloc(1, [req]) if self.pools.states is not None else pool.alloc(1)
        assert rows is not None
        rest = len(ids) - prefix
        own = self.pools.allocator.alloc(-(-rest // self.page_size) * self.page_size)
        assert own is not None
        slots = torch.cat([match.device_indices, own[:rest]])
        self.pools.req_to_token.write((rows[0], slice(0, len(ids))), slots.to(torch.int32))
        req.req_pool_idx, req.cache_protected_len = rows[0], prefix
        req.last_node = match.last_device_node
        req.prefix_indices = match.device_indices
        return req

    def fill_state(self, req: Req, value: float) -> None:
        slot = self.pools.req_to_token.state_slot(req.req_pool_idx)
        for t in self.state_pool.mamba_cache.tensors():
            t[:, slot] = value

    def state_value(self, slot: int) -> float:
        return float(next(iter(self.state_pool.mamba_cache.tensors()))[:, slot].flatten()[0])

    def check(self) -> None:
        self.cache.check_invariants()
        self.pools.allocator.check_invariants()
