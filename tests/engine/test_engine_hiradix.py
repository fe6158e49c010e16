"""The engine over HiRadixCache: host hits loaded back layer by layer give cache-free logits."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from hicache.engine import CacheSpec, EngineConfig, build_engine
from hicache.model import ModelConfig, TinyTransformer
from hicache.radix import HiCacheConfig, RadixKey
from tests.engine.helpers import LoadSpy, assert_matches_reference, assert_no_leak, chat

MHA = ModelConfig(attention="mha", num_layers=3)
MLA = ModelConfig(attention="mla", num_layers=3, num_kv_heads=1)
RECORD = EngineConfig(max_running_requests=3, max_prefill_tokens=48, record_logits=True)
HOST_FIELDS = {f.name for f in fields(HiCacheConfig)}


def hi_engine(
    cfg: ModelConfig, device: str = "cpu", config: EngineConfig = RECORD, **options: object
):
    """A HiRadixCache engine whose device pool (160 slots) is far smaller than the chats' KV,
    so prefixes are offloaded and come back from the host; its load waits are spied on.
    ``options`` are ``CacheSpec`` fields or host-tier (``HiCacheConfig``) fields."""
    host = {"hicache_ratio": 8.0, "load_back_threshold": 4}
    host.update({k: v for k, v in options.items() if k in HOST_FIELDS})
    base = {"kind": "hiradix", "device_tokens": 160, "max_context_len": 512, "max_requests": 8}
    base.update({k: v for k, v in options.items() if k not in HOST_FIELDS})
    spec = CacheSpec(**base, hicache=HiCacheConfig(**host))
    engine = build_engine(TinyTransformer(cfg, device), spec, config)
    return engine, LoadSpy(engine.cache.cache_controller.layer_done_counter)


def host_hits(reqs: list) -> int:
    return sum(r.host_hit for r in reqs)


@pytest.mark.parametrize("cfg", [MHA, MLA], ids=["mha", "mla"])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("layers_ahead", [None, 1], ids=["whole", "ahead1"])
def test_host_hits_load_back_and_match_reference(
    cfg: ModelConfig, page_size: int, layers_ahead: int | None
) -> None:
    """Also with the later layers of each load batch issued by the forward pass itself."""
    engine, spy = hi_engine(cfg, page_size=page_size, layers_ahead=layers_ahead)
    reqs = chat(engine, users=4, rounds=3, seed=2)
    assert host_hits(reqs) > 0, "memory pressure should have sent prefixes to the host"
    spy.assert_layer_wise(cfg.num_layers)
    assert_matches_reference(engine, reqs, atol=1e-5)
    assert_no_leak(engine)


@pytest.mark.parametrize(
    ("write_policy", "mem_layout", "io_backend"),
    [
        ("write_through", "page_first", "kernel"),
        ("write_through_selective", "page_head", "kernel"),
        ("write_back", "page_first_direct", "direct"),
        ("write_back", "layer_first", "direct"),
    ],
)
def test_policies_and_layouts_match_reference(
    write_policy: str, mem_layout: str, io_backend: str
) -> None:
    engine, _ = hi_engine(
        MHA, write_policy=write_policy, mem_layout=mem_layout, io_backend=io_backend
    )
    reqs = chat(engine, users=4, rounds=3, seed=3)
    assert_matches_reference(engine, reqs, atol=1e-5)
    assert_no_leak(engine)


def test_host_tier_reuses_more_than_device_only() -> None:
    hi, _ = hi_engine(MHA)
    radix = build_engine(
        hi.model,
        CacheSpec(kind="radix", device_tokens=160, max_context_len=512, max_requests=8),
        RECORD,
    )
    reused = [sum(r.device_hit + r.host_hit for r in chat(e, 4, 3)) for e in (hi, radix)]
    assert reused[0] > reused[1]


@pytest.mark.parametrize(
    ("policy", "seed", "cfg"),
    [("filo", 2, MLA), ("mru", 3, MHA), ("lfu", 2, MHA)],
    ids=["filo-mla", "mru-mha", "lfu-mha"],
)
def test_write_back_eviction_leaves_no_write_pending(
    policy: str, seed: int, cfg: ModelConfig
) -> None:
    """Regression: a write_back ``evict`` that freed enough through backed-up leaves while
    other leaves' writes were still queued left those nodes locked, so the slots an admitted
    request had reserved could not be evicted ("out of KV slots for admitted request")."""
    engine, _ = hi_engine(
        cfg,
        config=EngineConfig(4, 7, record_logits=True),
        device_tokens=96,
        hicache_ratio=1.5,
        write_policy="write_back",
        eviction_policy=policy,
        load_back_threshold=1,
    )
    cache, evict = engine.cache, engine.cache.evict

    def evict_and_check(num_tokens: int) -> int:
        freed = evict(num_tokens)
        assert not cache.cache_controller.write_queue, "evict returned with writes queued"
        return freed

    cache.evict = evict_and_check
    reqs = chat(
        engine, users=3, rounds=2, seed=seed, system_len=16, turn_len=(20, 30), answer_len=(1, 3)
    )
    assert host_hits(reqs) > 0
    assert_matches_reference(engine, reqs, atol=1e-5)
    assert_no_leak(engine)


def test_alloc_retires_backups_in_flight_before_giving_up() -> None:
    """Nodes whose backup is queued are locked; an allocation that needs their slots lands the
    writes, retires the acks and then evicts them instead of failing."""
    engine, _ = hi_engine(MHA, write_policy="write_through_selective")
    (req,) = chat(engine, users=1, rounds=1, system_len=64)
    cache, key = engine.cache, RadixKey(req.origin_input_ids + req.output_ids[:-1])
    for _ in range(3):  # the 2nd hit queues the backups of the whole path
        cache.match_prefix(key)
    assert cache.evictable_size() == 0 < cache.protected_size()
    want = engine.allocator.available_size() + 32
    assert engine.budget.alloc(want) is not None
    assert cache.protected_size() == 0 and cache.host_size() > 0
    cache.check_invariants()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("attention", ["mha", "mla"])
@pytest.mark.parametrize("layers_ahead", [None, 1], ids=["whole", "ahead1"])
def test_bf16_cuda_matches_reference_within_bf16_noise(
    attention: str, layers_ahead: int | None
) -> None:
    """bf16 tolerance: the cached run computes a prefix's K/V in other GEMM shapes (and
    attention over other query blocks) than the from-scratch prefill, so values may round
    differently by one bf16 ulp (2^-8 relative); the bf16 residual stream carries that to
    logit differences of a few 1e-2 on logits of std ~1 (the same test in bf16 on CPU measures
    at most 0.03). atol 0.1 is ~3x that and far below the logit spread, so a wrong or stale KV
    row still fails. Greedy tokens must agree wherever the reference top-2 margin exceeds
    twice the tolerance. The LM head runs in fp32, so logits carry no final bf16 rounding."""
    cfg = ModelConfig(
        attention=attention,
        num_layers=4,
        num_heads=8,
        head_dim=64,
        num_kv_heads=2 if attention == "mha" else 1,
        dtype=torch.bfloat16,
    )
    engine, spy = hi_engine(cfg, "cuda", device_tokens=256, layers_ahead=layers_ahead)
    reqs = chat(engine, users=4, rounds=3, seed=4, system_len=64, turn_len=(16, 40))
    assert host_hits(reqs) > 0
    spy.assert_layer_wise(cfg.num_layers)
    assert_matches_reference(engine, reqs, atol=0.1, margin=0.2)
    torch.cuda.synchronize()  # let the last backups land, then retire their acks
    engine.cache.check_hicache_events()
    assert_no_leak(engine)
