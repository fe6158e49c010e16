"""Misuse of a hybrid cache: clear errors before any change; corruption caught by the checker."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import ReqToTokenPool
from hicache.radix import RadixKey
from hicache.radix.components import CheckpointPolicy, HybridConfig
from hicache.radix.hybrid_cache import HybridRadixCache
from tests.radix.hybrid_rig import HybridRig

A = list(range(100, 116))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, "needs sliding_window or recurrent"),
        ({"sliding_window": 0}, ValueError, "sliding_window"),
        ({"recurrent": 1}, TypeError, "recurrent must be a bool"),
        ({"recurrent": True, "checkpoint": "finish"}, TypeError, "checkpoint must be"),
    ],
)
def test_bad_hybrid_config(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        HybridConfig(**kwargs)


def test_bad_checkpoint_policy() -> None:
    with pytest.raises(TypeError, match="at_branch must be a bool"):
        CheckpointPolicy(at_branch=None)
    with pytest.raises(ValueError, match="every_tokens"):
        CheckpointPolicy(every_tokens=0)


def test_bad_constructor_arguments() -> None:
    rig = HybridRig()
    pools, hybrid = rig.pools, rig.cache.hybrid
    with pytest.raises(TypeError, match="hybrid must be a HybridConfig"):
        HybridRadixCache(pools.req_to_token, pools.allocator, hybrid=None)
    plain = ReqToTokenPool(2, 64, "cpu")
    with pytest.raises(TypeError, match="must be a HybridReqToTokenPool"):
        HybridRadixCache(plain, pools.allocator, hybrid=hybrid)
    with pytest.raises(ValueError, match="state_pool is given but hybrid.recurrent is False"):
        HybridRadixCache(None, None, hybrid=HybridConfig(4), state_pool=rig.state_pool)
    with pytest.raises(ValueError, match="needs a state_pool"):
        HybridRadixCache(None, None, hybrid=hybrid)


@pytest.mark.parametrize(
    ("state", "n", "error", "match"),
    [
        (True, 8, TypeError, "state must be an int slot"),
        (torch.tensor([1.0]), 8, TypeError, "state must be an int slot"),
        (0, 8, ValueError, "not an allocated slot"),
        (None, 6, ValueError, "non-empty multiple of page_size=4"),
    ],
)
def test_a_bad_state_changes_nothing(state, n, error, match) -> None:
    rig = HybridRig(page_size=4)
    if state is None:
        state = int(rig.state_pool.alloc(1)[0])
    slots = rig.pools.allocator.alloc(8)
    free = rig.state_pool.available_size()
    with pytest.raises(error, match=match):
        rig.cache.insert(RadixKey(A[:n]), slots[:n], state=state)
    assert rig.cache.total_size() == 0 and rig.state_pool.available_size() == free


def test_a_state_held_twice_or_without_linear_layers_is_refused() -> None:
    rig = HybridRig()
    held = rig.put(A[:8])
    slots = rig.pools.allocator.alloc(16)
    with pytest.raises(ValueError, match=f"state={held} is already a node's state"):
        rig.cache.insert(RadixKey(A), slots, state=held)
    swa_only = HybridRig(pattern="FS")
    with pytest.raises(ValueError, match="no linear layers"):
        swa_only.cache.insert(RadixKey(A), swa_only.pools.allocator.alloc(16), state=1)


def test_bad_eviction_counts() -> None:
    cache = HybridRig().cache
    with pytest.raises(ValueError, match="num_tokens"):
        cache.evict_swa(-1)
    with pytest.raises(TypeError, match="num_states"):
        cache.evict_states("1")


def test_the_checker_catches_a_state_freed_behind_the_tree() -> None:
    rig = HybridRig()
    slot = rig.put(A[:8])
    rig.state_pool.free(torch.tensor([slot]))
    with pytest.raises(RuntimeError, match="not allocated in the pool"):
        rig.check()


def test_the_checker_catches_swa_freed_behind_the_tree_and_a_wrong_gauge() -> None:
    rig = HybridRig()
    rig.put(A[:8], with_state=False)
    node = rig.cache.match_prefix(RadixKey(A[:8])).full_kv_node
    rig.pools.allocator.free_swa(node.value)
    with pytest.raises(RuntimeError, match="live node lacks an SWA slot"):
        rig.check()
    other = HybridRig()
    other.put(A[:8], with_state=False)
    other.cache.evict_swa(8)
    other.cache.components.swa_tombstoned_tokens = 3
    with pytest.raises(RuntimeError, match="swa_tombstoned_tokens=3"):
        other.check()
