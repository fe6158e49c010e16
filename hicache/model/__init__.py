"""A tiny decoder-only transformer (MHA/GQA or MLA; full, sliding-window and linear layers)
whose KV and recurrent state live in hicache pools."""

from hicache.model.batch import ForwardBatch
from hicache.model.config import ModelConfig
from hicache.model.hybrid_pools import ModelPools, make_model_pools, state_params
from hicache.model.kv import make_kv_pool
from hicache.model.reference import reference_logits
from hicache.model.shard import TPShard, kv_dims
from hicache.model.transformer import TinyTransformer

__all__ = [
    "ForwardBatch",
    "ModelConfig",
    "ModelPools",
    "TPShard",
    "TinyTransformer",
    "kv_dims",
    "make_kv_pool",
    "make_model_pools",
    "reference_logits",
    "state_params",
]
