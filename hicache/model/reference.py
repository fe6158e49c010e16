"""A cache-free run of a model of any layer pattern: what a cached run must reproduce."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import torch

from hicache.model.batch import ForwardBatch
from hicache.model.hybrid_pools import make_model_pools
from hicache.model.transformer import TinyTransformer


def reference_logits(model: TinyTransformer, token_ids: Sequence[int]) -> torch.Tensor:
    """Next-token logits at every position of ``token_ids`` from one prefill in fresh pools
    (``make_model_pools``, page size 1; a zeroed state for ``L`` layers).

    No prefix cache is involved: this is the from-scratch answer a cached run must reproduce.

    Returns
    -------
    ``[len(token_ids), vocab]`` fp32 on the model device; row ``i`` predicts token ``i + 1``.
    """
    n = len(token_ids)
    pools = make_model_pools(model.cfg, n, 1, model.device, 1, shard=model.shard)
    states = pools.states
    if states is not None:
        rows = states.alloc(1, [SimpleNamespace(req_pool_idx=None, mamba_pool_idx=None)])
    else:
        rows = pools.req_to_token.alloc(1)
    slots = pools.allocator.alloc(n)
    assert rows is not None and slots is not None
    pools.req_to_token.write((rows[0], slice(0, n)), slots.to(torch.int32))
    table = pools.req_to_token.req_to_token
    batch = ForwardBatch.build(table, rows, [0], [list(token_ids)], slots, model.device)
    logits: torch.Tensor = model(batch, pools.kv, all_logits=True, states=states)
    return logits
