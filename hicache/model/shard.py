"""Which slice of the model one tensor-parallel rank holds, and the all-reduce that joins them.

Attention is split by heads (MHA: q heads and KV heads, each rank a contiguous block; MLA: the
q/out heads, the latent is whole on every rank), the SwiGLU MLP by intermediate columns. A
column-parallel linear keeps rank r's rows of the full weight (its output features), a
row-parallel one its columns (input features); the attention output and MLP down projections
are row-parallel and their partial sums are all-reduced over the group. Embedding, norms and
the LM head are whole on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hicache.checks import check_int
from hicache.model.config import ModelConfig


@dataclass(frozen=True)
class TPShard:
    """Rank ``rank`` of ``size`` tensor-parallel ranks joined by ``group``.

    Attributes
    ----------
    rank, size : this rank and the group size (``0 <= rank < size``).
    group : the ``torch.distributed`` process group the all-reduces run on (gloo on CPU, NCCL
        on CUDA); None for one rank, required for more.
    """

    rank: int = 0
    size: int = 1
    group: Any = None

    def __post_init__(self) -> None:
        check_int("size", self.size, minimum=1)
        check_int("rank", self.rank, minimum=0)
        if self.rank >= self.size:
            raise ValueError(f"rank must be < size={self.size}, got {self.rank}")
        if self.size > 1 and self.group is None:
            raise ValueError(f"group: a shard of {self.size} ranks needs a process group")

    @classmethod
    def of(cls, group: Any) -> TPShard:
        """This process's shard of ``group`` (a ``ProcessGroup``; None: one rank)."""
        if group is None:
            return cls()
        if not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"group must be a ProcessGroup or None, got {type(group).__name__}")
        return cls(dist.get_rank(group), dist.get_world_size(group), group)

    def check(self, cfg: ModelConfig) -> None:
        """``ValueError`` naming the field unless ``cfg`` splits evenly over ``size`` ranks."""
        names = ["num_heads", "intermediate_size"]
        if cfg.attention == "mha":
            names.insert(1, "num_kv_heads")
        for name in names:
            if getattr(cfg, name) % self.size:
                raise ValueError(
                    f"{name} ({getattr(cfg, name)}) must be a multiple of the TP size ({self.size})"
                )

    def part(self, total: int) -> slice:
        """This rank's contiguous block of ``total`` items (``total % size == 0``)."""
        n = total // self.size
        return slice(self.rank * n, (self.rank + 1) * n)

    def kv_heads(self, cfg: ModelConfig) -> int:
        """MHA KV heads this rank holds: its block of ``cfg.num_kv_heads``."""
        return cfg.num_kv_heads // self.size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` summed over the ranks, in place (unchanged for one rank); every rank gets the
        same values."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x


def kv_dims(cfg: ModelConfig, shard: TPShard) -> dict[str, int]:
    """The device pool dims of ``shard``'s part of ``cfg``'s KV: ``head_num``/``head_dim``
    (MHA, the shard's KV heads) or ``kv_lora_rank``/``qk_rope_head_dim`` (MLA, whole)."""
    if cfg.attention == "mla":
        return {"kv_lora_rank": cfg.kv_lora_rank, "qk_rope_head_dim": cfg.qk_rope_head_dim}
    return {"head_num": shard.kv_heads(cfg), "head_dim": cfg.head_dim}
