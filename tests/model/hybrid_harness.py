"""A hybrid model with its pools, poisoned where the pools write, serving requests by steps."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from hicache.model import ForwardBatch, ModelConfig, TinyTransformer, make_model_pools

PATTERNS = ["F", "S", "L", "FSL", "FSLFSL"]
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        ],
    ),
]


def hybrid_config(pattern: str, attention: str, **extra: object) -> ModelConfig:
    """A tiny fp32 model of ``pattern``: a window of 8 keys, a conv of 4 inputs."""
    heads = {"num_kv_heads": 1} if attention == "mla" else {}
    return ModelConfig(
        num_layers=len(pattern),
        layer_pattern=pattern,
        attention=attention,
        sliding_window=8,
        linear_state_size=4,
        **heads,  # type: ignore[arg-type]
        **extra,  # type: ignore[arg-type]
    )


class Harness:
    """``TinyTransformer(cfg)`` over ``make_model_pools``; every KV and state buffer starts NaN,
    so reading anything no forward wrote (or a freed slot) turns the logits NaN."""

    def __init__(self, cfg: ModelConfig, page_size: int, device: str = "cpu") -> None:
        self.cfg, self.page_size, self.device = cfg, page_size, device
        self.model = TinyTransformer(cfg, device)
        self.pools = make_model_pools(cfg, 512, page_size, device, rows=8, state_slots=12)
        self.slots: dict[int, list[int]] = {}  # row -> its tokens' slots, by position
        self.spare: dict[int, list[int]] = {}  # row -> unused slots of its last page
        poison(self)

    def open(self) -> int:
        """A new request row (with a zeroed state slot when the model has L layers)."""
        states = self.pools.states
        if states is not None:
            rows = states.alloc(1, [SimpleNamespace(req_pool_idx=None, mamba_pool_idx=None)])
        else:
            rows = self.pools.req_to_token.alloc(1)
        assert rows is not None
        self.slots[rows[0]], self.spare[rows[0]] = [], []
        return rows[0]

    def step(self, rows: list[int], ids: list[list[int]]) -> torch.Tensor:
        """Extend each row by its ``ids`` in one batch: ``[sum(len), vocab]`` logits."""
        prefix = [len(self.slots[r]) for r in rows]
        new = [self.take(r, len(x)) for r, x in zip(rows, ids, strict=True)]
        for r, p, s in zip(rows, prefix, new, strict=True):
            self.pools.req_to_token.write((r, slice(p, p + len(s))), torch.tensor(s).int())
        loc = torch.tensor([s for ss in new for s in ss], dtype=torch.int64, device=self.device)
        table = self.pools.req_to_token.req_to_token
        batch = ForwardBatch.build(table, rows, prefix, ids, loc, self.device)
        out: torch.Tensor = self.model(batch, self.pools.kv, True, self.pools.states)
        return out

    def take(self, row: int, n: int) -> list[int]:
        """``n`` slots for ``row``: its last page's spare ones first, then whole new pages."""
        spare, ps = self.spare[row], self.page_size
        need = n - len(spare)
        if need > 0:
            pages = self.pools.allocator.alloc(math.ceil(need / ps) * ps)
            assert pages is not None
            spare = spare + pages.tolist()
        self.slots[row] += spare[:n]
        self.spare[row] = spare[n:]
        return spare[:n]


def poison(h: Harness) -> None:
    """NaN into every KV buffer (padding slots included) and every state slot."""
    kv = h.pools.kv
    for layer in h.cfg.layers_of("FS"):
        kv.get_key_buffer(layer).fill_(torch.nan)
        kv.get_value_buffer(layer).fill_(torch.nan)
    states = h.pools.states
    if states is not None:
        for t in states.mamba_pool.mamba_cache.tensors():
            t.fill_(torch.nan)


def random_prompt(cfg: ModelConfig, n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    ids: list[int] = torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
    return ids
