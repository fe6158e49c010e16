"""The engine on 2 TP ranks (one launch): shard weights, pools, logits, tokens and hits against
one rank; agreed allocation failures; misuse."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from hicache.engine import build_engine
from hicache.model import ModelConfig, TinyTransformer, TPShard
from hicache.tp import run_ranks
from tests.tp_engine import ranks

# fp32 logits of a TP=2 run against one rank: the attention and MLP outputs are summed in a
# different order (two partial sums, all-reduced), measured at most ~3e-6 on logits of
# magnitude ~5; the bound leaves room for other shapes and seeds.
TOL = 1e-4


@pytest.fixture(scope="module")
def tp2() -> list[dict[str, Any]]:
    return run_ranks(ranks.tp_checks, 2, timeout_s=120)


@pytest.fixture(scope="module")
def one_rank() -> dict[str, Any]:
    torch.set_num_threads(1)
    cfgs = {"mha": ranks.MHA, "mla": ranks.MLA}
    return {
        name: ranks.run_chat(build_engine(TinyTransformer(cfg), ranks.SPEC, ranks.ENGINE))
        for name, cfg in cfgs.items()
    }


def test_shard_weights_are_exact_blocks_and_pools_hold_the_shard(tp2: list[dict]) -> None:
    for out in tp2:
        assert out["mha bad blocks"] == [] and out["mla bad blocks"] == []
        # [slots + page, heads, dim]: MHA half the KV heads, MLA the whole latent
        assert out["mha pool"][1:] == (ranks.MHA.num_kv_heads // 2, ranks.MHA.head_dim)
        assert out["mla pool"][1:] == (1, ranks.MLA.kv_lora_rank + ranks.MLA.qk_rope_head_dim)


@pytest.mark.parametrize("name", ["mha", "mla"])
def test_tp_run_matches_one_rank(tp2: list[dict], one_rank: dict, name: str) -> None:
    want = one_rank[name]
    hits = want["hits"]
    assert sum(h[0] for h in hits) > 0 and sum(h[1] for h in hits) > 0, "device and host hits"
    worst = 0.0
    for out in tp2:
        got = out[name]
        assert got["tokens"] == want["tokens"]
        assert got["hits"] == hits
        for a, b in zip(got["logits"], want["logits"], strict=True):
            worst = max(worst, float(np.abs(a - b).max()))
    assert worst <= TOL
    for a, b in zip(tp2[0][name]["logits"], tp2[1][name]["logits"], strict=True):
        assert np.array_equal(a, b), "the all-reduce gives every rank the same logits"


def test_rank_local_allocation_failures_are_agreed(tp2: list[dict]) -> None:
    """Rank 1 alone fails some allocations; both ranks took the same branches (the caches
    compared tree digests every step) and produced the same tokens, hits and logits."""
    first, second = (out["faults"] for out in tp2)
    assert (first["failed"], second["failed"]) == (0, 5), "rank 1's failures were injected"
    assert first["tokens"] == second["tokens"] and first["hits"] == second["hits"]
    assert all(np.array_equal(a, b) for a, b in zip(first["logits"], second["logits"], strict=True))


def test_a_host_hit_prefill_step_takes_three_agreements_and_failures_fold_cleanly(
    tp2: list[dict],
) -> None:
    """Admission with its load-back, then the step's slots with the load issue's settle, then
    the backup's host slots: 3 collectives. A row or slots failing on rank 1 alone: the same
    branch on both ranks, nothing leaked (free + tree slots stay the device's)."""
    first, second = (out["host hits"] for out in tp2)
    assert (first["failed"], second["failed"]) == ([], [1, 1])
    for out in (first, second):
        assert out["steps"][0] == [3]
        assert len(out["steps"][1]) == 2, "the refused admission waited one step"
        assert len(out["steps"][2]) == 1, "the slots were allocated again in the step"
        assert all(host > 0 for _, host, _ in out["hits"])
        assert len(set(out["held"])) == 1, out["held"]
    assert first["hits"] == second["hits"] and first["digest"] == second["digest"]


def test_engine_refuses_a_cache_of_another_tp_size(tp2: list[dict]) -> None:
    for out in tp2:
        assert "cache.tp must be rank 0 of 1" in out["one-rank model in a TP cache"]


def test_shard_checks() -> None:
    group = object()  # never used: every check runs before a collective
    with pytest.raises(ValueError, match="num_heads"):
        TinyTransformer(ModelConfig(num_heads=4, num_kv_heads=2), shard=TPShard(0, 3, group))
    with pytest.raises(ValueError, match="num_kv_heads"):
        TinyTransformer(ModelConfig(num_heads=4, num_kv_heads=1), shard=TPShard(0, 2, group))
    with pytest.raises(ValueError, match="intermediate_size"):
        TinyTransformer(ModelConfig(intermediate_size=33), shard=TPShard(1, 2, group))
    mla = ModelConfig(attention="mla", num_heads=4, num_kv_heads=1)
    assert TinyTransformer(mla, shard=TPShard(1, 2, group)).layers[0].attn.heads == 2
    with pytest.raises(ValueError, match="rank"):
        TPShard(2, 2, group)
    with pytest.raises(ValueError, match="size"):
        TPShard(0, 0)
    with pytest.raises(ValueError, match="group"):
        TPShard(0, 2)
    with pytest.raises(TypeError, match="shard"):
        TinyTransformer(mla, shard=2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="group"):
        TPShard.of(group)
