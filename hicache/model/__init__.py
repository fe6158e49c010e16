"""A tiny decoder-only transformer (MHA/GQA or MLA) whose KV lives in hicache token pools."""

from hicache.model.batch import ForwardBatch
from hicache.model.config import ModelConfig
from hicache.model.kv import make_kv_pool, reference_logits
from hicache.model.shard import TPShard, kv_dims
from hicache.model.transformer import TinyTransformer

__all__ = [
    "ForwardBatch",
    "ModelConfig",
    "TPShard",
    "TinyTransformer",
    "kv_dims",
    "make_kv_pool",
    "reference_logits",
]
