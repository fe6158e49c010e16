"""The public face: ``hicache.__all__`` and ``build_kv_stack`` end to end on the CPU."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

import hicache
from hicache import (
    HiCacheConfig,
    HiRadixCache,
    KVStack,
    MatchResult,
    MHATokenToKVPool,
    MLATokenToKVPool,
    RadixCache,
    RadixKey,
    Req,
    build_kv_stack,
)

MHA: dict[str, Any] = {"layer_num": 2, "head_num": 2, "head_dim": 8, "dtype": torch.float32}
SIZES: dict[str, Any] = {"size": 32, "max_requests": 2, "max_context_len": 30, "page_size": 2}
OPS = [
    "transfer_kv_per_layer",
    "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
    "transfer_kv_all_layer",
    "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph",
    "transfer_kv_per_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf",
    "transfer_kv_all_layer_mla",
    "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct",
    "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_all_layer_direct_lf_pf",
]
# Names other code imports from the subpackages; each must stay there.
KEPT = {
    "hicache.kernels": OPS,
    "hicache.pools": [
        "ReqToTokenPool",
        "TokenToKVPoolAllocator",
        "MHATokenToKVPool",
        "MLATokenToKVPool",
        "MHATokenToKVPoolHost",
        "MLATokenToKVPoolHost",
        "MambaStateParams",
        "MambaPool",
        "HybridReqToTokenPool",
        "NSATokenToKVPool",
        "DoubleSparseTokenToKVPool",
        "SWAKVPool",
        "SWATokenToKVPoolAllocator",
        "HybridLinearKVPool",
        "MHATokenToKVPoolFP4",
        "MLATokenToKVPoolFP4",
    ],
    "hicache.controller": ["HiCacheController", "LayerDoneCounter", "LayerLoadingEvent"],
    "hicache.radix": [
        "RadixCache",
        "HiRadixCache",
        "TreeNode",
        "RadixKey",
        "MatchResult",
        "Req",
        "RadixCacheConfig",
        "HiCacheConfig",
        "EVICTION_POLICIES",
        "HybridRadixCache",
        "HybridConfig",
        "CheckpointPolicy",
    ],
}


def test_every_public_name_imports() -> None:
    star: dict[str, Any] = {}
    exec("from hicache import *", star)
    assert set(hicache.__all__) <= set(star)
    assert len(set(hicache.__all__)) == len(hicache.__all__)
    assert hicache.__version__ == "0.5.0"


@pytest.mark.parametrize("module", sorted(KEPT))
def test_subpackages_export_what_callers_import(module: str) -> None:
    mod = importlib.import_module(module)
    assert set(KEPT[module]) <= set(mod.__all__)
    assert all(hasattr(mod, name) for name in mod.__all__)


PLANS = {
    "DirectLayerPlan",
    "LayerPlan",
    "plan_direct",
    "plan_direct_pf_lf",
    "plan_per_layer",
    "plan_per_layer_pf_lf",
    "plan_per_layer_ph_lf",
}


def test_kernels_export_exactly_the_thirteen_ops_and_their_plans() -> None:
    kernels = importlib.import_module("hicache.kernels")
    assert set(kernels.__all__) == {*OPS, *PLANS, "DEFAULT_NUM_WARPS"}


def _write_request(stack: KVStack, ids: list[int]) -> tuple[Req, torch.Tensor]:
    """A request over ``ids`` whose every slot holds KV derived from its token id."""
    row = stack.req_to_token_pool.alloc(1)
    slots = stack.allocator.alloc(len(ids))
    assert row is not None and slots is not None and isinstance(stack.kv_pool, MHATokenToKVPool)
    stack.req_to_token_pool.write((row[0], slice(0, len(ids))), slots.to(torch.int32))
    for layer in range(stack.kv_pool.layer_num):
        kv = torch.tensor(ids, dtype=torch.float32)[:, None, None] * (layer + 1)
        kv = kv.expand(len(ids), 2, 8)
        stack.kv_pool.set_kv_buffer(layer, slots, kv, -kv)
    return Req(row[0], ids, kv_len=len(ids)), slots


def _keys(stack: KVStack, slots: torch.Tensor) -> list[torch.Tensor]:
    pool = stack.kv_pool
    return [pool.get_key_buffer(layer)[slots].clone() for layer in range(pool.layer_num)]


def test_a_stack_caches_evicts_to_host_and_loads_back_byte_exact() -> None:
    stack = build_kv_stack(**MHA, **SIZES, hicache=HiCacheConfig(load_back_threshold=0))
    cache = stack.cache
    assert isinstance(cache, HiRadixCache) and isinstance(stack.kv_pool, MHATokenToKVPool)
    assert stack.allocator.get_kvcache() is stack.kv_pool
    ids = list(range(3, 15))
    req, slots = _write_request(stack, ids)
    want = _keys(stack, slots)
    cache.cache_finished_req(req)
    hit = cache.match_prefix(RadixKey(ids))
    assert isinstance(hit, MatchResult) and torch.equal(hit.device_indices, slots)
    cache.check_hicache_events()
    assert cache.evict(cache.total_size()) >= len(ids) and cache.total_size() == 0
    hit = cache.match_prefix(RadixKey(ids))
    assert len(hit.device_indices) == 0 and hit.host_hit_length == len(ids)
    loaded, _ = cache.init_load_back(hit.last_host_node, hit.host_hit_length)
    cache.ready_to_load_host_cache()
    cache.check_hicache_events()
    assert len(loaded) == len(ids)
    got = _keys(stack, loaded)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    cache.check_invariants()


def test_without_a_host_tier_the_stack_is_a_device_radix_cache() -> None:
    mla: dict[str, Any] = {
        "layer_num": 1,
        "kv_lora_rank": 8,
        "qk_rope_head_dim": 4,
        "dtype": torch.bfloat16,
    }
    stack = build_kv_stack(**mla, **SIZES)
    assert type(stack.cache) is RadixCache and isinstance(stack.kv_pool, MLATokenToKVPool)
    assert stack.req_to_token_pool.req_to_token.shape == (2, 30)
    assert stack.cache.insert(RadixKey([1, 2, 3, 4]), stack.allocator.alloc(4)) == 0


BAD = [
    ({"size": 33}, ValueError, "size"),
    ({"size": 32.0}, TypeError, "size"),
    ({"max_requests": 0}, ValueError, "max_requests"),
    ({"max_context_len": True}, TypeError, "max_context_len"),
    ({"page_size": 0}, ValueError, "page_size"),
    ({"layer_num": None}, TypeError, "layer_num"),
    ({"head_dim": None}, ValueError, "head_dim"),
    ({"kv_lora_rank": 8}, ValueError, "kv_lora_rank"),
    ({"head_num": 0}, ValueError, "head_num"),
    ({"dtype": torch.int32}, TypeError, "dtype"),
    ({"dtype": "float32"}, TypeError, "dtype"),
    ({"device": "tpu"}, ValueError, "device"),
    ({"eviction_policy": "random"}, ValueError, "eviction_policy"),
    ({"hicache": {"hicache_ratio": 4.0}}, TypeError, "hicache"),
    ({"hicache": HiCacheConfig(hicache_ratio=0.0)}, ValueError, "host"),
]


@pytest.mark.parametrize(("change", "error", "name"), BAD, ids=[b[2] for b in BAD])
def test_bad_arguments_raise_before_anything_is_allocated(
    change: dict[str, Any], error: type, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a pool was allocated before the arguments were checked")

    for pool in ("MHATokenToKVPool", "MLATokenToKVPool", "TokenToKVPoolAllocator"):
        monkeypatch.setattr(f"hicache.stack.{pool}", refuse)
    with pytest.raises(error, match=name):
        build_kv_stack(**{**MHA, **SIZES, **change})
