"""Page integrity (``verify``): a host page corrupted after its backup is never served.

The corruption goes through the host pool's public buffer (``kv_buffer``, indexed by the
documented layout shapes) after the backup, as a bad DIMM or a stray write would. With
``verify="all"`` the load-back stops before the node holding the bad page, drops that node and
its subtree from the host tier, counts the page, and the bytes it does serve are the originals;
``"off"`` serves the corrupt bytes (the trade-off it documents); ``"sample"`` verifies one
load-back in ``verify_sample_period``. Invariants and slot accounting are checked throughout.
"""

from __future__ import annotations

import pytest
import torch

from hicache.engine import CacheSpec
from hicache.model import ModelConfig
from hicache.pools import ROUTES
from hicache.radix import HiCacheConfig, RadixKey
from tests.engine.helpers import assert_matches_reference, assert_no_leak, chat
from tests.engine.test_engine_hiradix import hi_engine
from tests.radix.hiradix_rig import (
    LAYERS,
    POLICIES,
    assert_kv,
    device_pool,
    host_accounted,
    make_cache,
    put,
    scramble_free,
    tokens_of,
)


def corrupt(cache, host_slot: int, layer: int, part: int = -1, bit: int = 3) -> None:
    """Flip one bit of host slot ``host_slot`` at ``layer`` (K, V or the MLA latent)."""
    host = cache.cache_controller.mem_pool_host
    buf = host.kv_buffer if host.parts == 1 else host.kv_buffer[part]
    page, t = divmod(host_slot, host.page_size)
    token = {
        "layer_first": lambda: buf[layer, host_slot],
        "page_first": lambda: buf[host_slot, layer],
        "page_first_direct": lambda: buf[page, layer, t],
        "page_head": lambda: buf[page, :, t, layer],
    }[host.layout]()  # [H, D]
    word = token[0, 1:2].view(torch.int32)
    word ^= 1 << bit


def balanced(cache) -> bool:
    """No request holds slots: every device slot is free or in the tree; same for host slots."""
    allocator = cache.token_to_kv_pool_allocator
    device_ok = allocator.available_size() + cache.total_size() == allocator.size
    return device_ok and host_accounted(cache)


def offloaded(
    kind="mha",
    io_backend="kernel",
    layout="layer_first",
    page_size=2,
    verify="all",
    device="cpu",
    **kwargs,
):
    """Tokens ``a`` (3 pages) and ``b`` (a's first 2 pages + 2 more) backed up, then evicted:
    host-only nodes A1 (2 pages) -> A2 (1 page) and A1 -> B2 (2 pages)."""
    cache = make_cache(
        kind, io_backend, layout, page_size, pages=8, verify=verify, device=device, **kwargs
    )
    a = tokens_of(3 * page_size, seed=1)
    b = a[: 2 * page_size] + tokens_of(2 * page_size, seed=2)
    put(cache, a)
    put(cache, b)
    if cache.write_policy == "write_through_selective":
        for _ in range(2):
            cache.match_prefix(RadixKey(a))
            cache.match_prefix(RadixKey(b))
    if device == "cuda":
        torch.cuda.synchronize()  # the backups land, so their acks pop and the nodes unlock
    cache.check_hicache_events()
    cache.evict(cache.total_size())
    scramble_free(cache)
    cache.check_invariants()
    assert cache.total_size() == 0 and cache.host_size() == 5 * page_size
    return cache, a, b


def load_back(cache, tokens):
    """``init_load_back`` of ``tokens``' host hit, then issue and retire loads; invariants."""
    m = cache.match_prefix(RadixKey(tokens))
    loaded, node = cache.init_load_back(m.last_host_node, m.host_hit_length)
    cache.check_invariants()
    cache.ready_to_load_host_cache()
    cache.check_hicache_events()
    cache.check_invariants()
    return m, loaded, node


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize(("kind", "io_backend", "layout"), ROUTES)
def test_a_corrupt_page_is_never_served(kind, io_backend, layout, page_size) -> None:
    cache, a, b = offloaded(kind, io_backend, layout, page_size)
    p, pool = page_size, device_pool(cache)
    b2 = cache.match_prefix(RadixKey(b)).last_host_node
    a1 = b2.parent
    corrupt(cache, int(b2.host_value[p]), layer=LAYERS - 1)  # B2's second page, last layer
    m, loaded, node = load_back(cache, b)
    assert m.host_hit_length == 4 * p
    assert node is a1 and len(loaded) == 2 * p  # stops before the node with the bad page
    assert_kv(pool, loaded, b[: 2 * p])
    assert cache.integrity_failures == 1
    again = cache.match_prefix(RadixKey(b))
    assert len(again.device_indices) == 2 * p and again.host_hit_length == 0  # B2 is gone
    assert cache.host_size() == 3 * p and balanced(cache)

    put(cache, b)  # the request recomputes B2; backed up afresh
    cache.check_hicache_events()
    cache.evict(cache.total_size())
    scramble_free(cache)
    _, loaded, _ = load_back(cache, b)
    assert len(loaded) == 4 * p and cache.integrity_failures == 1
    assert_kv(pool, loaded, b)
    _, loaded, _ = load_back(cache, a)  # A2: clean
    assert len(loaded) == p and cache.integrity_failures == 1
    assert balanced(cache)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_bad_first_node_drops_its_whole_subtree(policy) -> None:
    cache, a, b = offloaded(page_size=2, write_policy=policy)
    a1 = cache.match_prefix(RadixKey(a)).last_host_node.parent
    corrupt(cache, int(a1.host_value[0]), layer=0, part=0, bit=31)
    _, loaded, node = load_back(cache, b)
    assert len(loaded) == 0 and node is cache.root
    assert cache.integrity_failures == 1
    assert cache.host_size() == 0 and not cache.root.children and balanced(cache)
    allocator = cache.token_to_kv_pool_allocator
    assert allocator.available_size() == allocator.size


def test_a_bad_page_inside_a_node_drops_the_node_from_its_start() -> None:
    cache, a, b = offloaded(page_size=1)
    b2 = cache.match_prefix(RadixKey(b)).last_host_node
    a1 = b2.parent
    corrupt(cache, int(b2.host_value[1]), layer=0)  # B2's last token (page 1 of 2)
    _, loaded, node = load_back(cache, b)
    assert node is a1 and len(loaded) == 2 and b2.parent is None  # B2 gone, page 0 too
    assert cache.integrity_failures == 1 and balanced(cache)


def test_every_bad_page_of_a_load_back_is_counted() -> None:
    cache, a, b = offloaded(page_size=1)
    b2 = cache.match_prefix(RadixKey(b)).last_host_node
    a1 = b2.parent
    for i, slot in enumerate(b2.host_value.tolist()):
        corrupt(cache, slot, layer=i % LAYERS)
    _, loaded, node = load_back(cache, b)
    assert node is a1 and len(loaded) == 2
    assert cache.integrity_failures == 2 and balanced(cache)


def test_off_serves_the_corrupt_page() -> None:
    """The trade-off of ``verify="off"``: nothing is checked, the flipped bit reaches the model."""
    cache, a, b = offloaded(verify="off")
    b2 = cache.match_prefix(RadixKey(b)).last_host_node
    corrupt(cache, int(b2.host_value[0]), layer=0)
    _, loaded, node = load_back(cache, b)
    assert node is b2 and len(loaded) == 8 and cache.integrity_failures == 0
    with pytest.raises(AssertionError, match="layer 0"):
        assert_kv(device_pool(cache), loaded, b)
    assert cache.cache_controller.integrity is None


def test_sample_verifies_one_load_back_in_each_period() -> None:
    cache, a, b = offloaded(verify="sample", verify_sample_period=2)
    pool = device_pool(cache)
    a2 = cache.match_prefix(RadixKey(a)).last_host_node
    b2 = cache.match_prefix(RadixKey(b)).last_host_node
    corrupt(cache, int(b2.host_value[0]), layer=0)
    corrupt(cache, int(a2.host_value[1]), layer=1)
    _, loaded, _ = load_back(cache, b)  # load-back 0: verified, caught
    assert len(loaded) == 4 and cache.integrity_failures == 1
    _, loaded, node = load_back(cache, a)  # load-back 1: not verified, A2 served as it is
    assert node is a2 and len(loaded) == 2 and cache.integrity_failures == 1
    with pytest.raises(AssertionError):
        assert_kv(pool, loaded, a[4:], start=4)
    cache.evict(cache.total_size())
    _, loaded, _ = load_back(cache, a)  # load-back 2: verified, A2 caught
    assert len(loaded) == 4 and cache.integrity_failures == 2
    assert_kv(pool, loaded, a[:4])
    assert balanced(cache)


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"verify": "on"}, ValueError),
        ({"verify": True}, ValueError),
        ({"verify": None}, ValueError),
        ({"verify_sample_period": 0}, ValueError),
        ({"verify_sample_period": 2.0}, TypeError),
        ({"verify_sample_period": True}, TypeError),
    ],
)
def test_bad_verify_settings_are_refused_before_anything_is_built(settings, error) -> None:
    name = next(iter(settings))
    with pytest.raises(error, match=name):
        make_cache(**settings)
    with pytest.raises(error, match=name):
        CacheSpec(kind="hiradix", hicache=HiCacheConfig(**settings))


def engine_recomputes_what_verification_drops(device: str, cfg: ModelConfig, **tolerance):
    """Every host page corrupted between two runs of the same chats (the device emptied): the
    host hits of the second run fail verification and are recomputed, and every logit matches a
    cache-free forward pass."""
    engine, _ = hi_engine(cfg, device, verify="all")
    chat(engine, users=3, rounds=2, seed=4)
    if device == "cuda":
        torch.cuda.synchronize()  # the last backups land; their acks pop
        engine.cache.check_hicache_events()
    engine.cache.evict(engine.cache.total_size())  # every cached prefix now on the host only
    host = engine.cache.cache_controller.mem_pool_host
    host.kv_buffer.view(torch.int32).bitwise_xor_(1 << 20)
    reqs = chat(engine, users=3, rounds=2, seed=4)
    assert engine.cache.integrity_failures > 0
    assert_matches_reference(engine, reqs, **tolerance)
    if device == "cuda":
        torch.cuda.synchronize()
        engine.cache.check_hicache_events()
    assert_no_leak(engine)
    engine.cache.check_invariants()


def test_the_engine_recomputes_what_verification_drops() -> None:
    engine_recomputes_what_verification_drops(
        "cpu", ModelConfig(attention="mha", num_layers=2), atol=1e-5
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_the_engine_recomputes_what_verification_drops_on_cuda(attention: str) -> None:
    """bf16 tolerances as ``test_engine_hiradix.test_bf16_cuda_matches_reference_...``."""
    cfg = ModelConfig(
        attention=attention,
        num_layers=4,
        num_heads=8,
        head_dim=64,
        num_kv_heads=2 if attention == "mha" else 1,
        dtype=torch.bfloat16,
    )
    engine_recomputes_what_verification_drops("cuda", cfg, atol=0.1, margin=0.2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("kind", "io_backend", "layout"), ROUTES)
def test_a_corrupt_page_is_never_served_on_cuda(kind, io_backend, layout) -> None:
    cache, a, b = offloaded(kind, io_backend, layout, page_size=16, device="cuda")
    b2 = cache.match_prefix(RadixKey(b)).last_host_node
    a1 = b2.parent
    corrupt(cache, int(b2.host_value[16]), layer=1)
    _, loaded, node = load_back(cache, b)
    torch.cuda.synchronize()
    assert node is a1 and len(loaded) == 32 and cache.integrity_failures == 1
    assert_kv(device_pool(cache), loaded, b[:32])
    _, loaded, _ = load_back(cache, a)
    torch.cuda.synchronize()
    assert len(loaded) == 16 and cache.integrity_failures == 1
    assert_kv(device_pool(cache), cache.match_prefix(RadixKey(a)).device_indices, a)
    assert balanced(cache)
