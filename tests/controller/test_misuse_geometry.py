"""Issue 12, controller/pool mismatch: a host pool built for another device pool is refused at
construction, naming what differs, before the controller registers anything; the host pool's own
transfers refuse such a device pool the same way."""

from __future__ import annotations

import pytest
import torch

from hicache.controller import HiCacheController
from hicache.pools import (
    MHATokenToKVPool,
    MHATokenToKVPoolHost,
    MLATokenToKVPool,
    MLATokenToKVPoolHost,
    TokenToKVPoolAllocator,
)

BASE = {
    "size": 8,
    "page_size": 2,
    "dtype": torch.float16,
    "head_num": 2,
    "head_dim": 8,
    "layer_num": 3,
    "device": "cpu",
}


def mha(**changes: object) -> MHATokenToKVPool:
    return MHATokenToKVPool(**{**BASE, **changes})


def mla(**changes: object) -> MLATokenToKVPool:
    args = {
        "size": 8,
        "page_size": 2,
        "dtype": torch.float16,
        "kv_lora_rank": 12,
        "qk_rope_head_dim": 4,
        "layer_num": 3,
        "device": "cpu",
    } | changes
    return MLATokenToKVPool(**args)


def host_for(pool: object) -> MHATokenToKVPoolHost | MLATokenToKVPoolHost:
    cls = MLATokenToKVPoolHost if isinstance(pool, MLATokenToKVPool) else MHATokenToKVPoolHost
    return cls(pool, 2.0, 0, pool.page_size, "layer_first")


# Each entry: a device pool the host pool is built for, and the field the message must name.
OTHERS = [
    (lambda: mha(head_dim=4), "head_dim"),
    (lambda: mha(head_num=1, head_dim=16), "head_num"),  # same item_size, other heads
    (lambda: mha(layer_num=2), "layer_num"),
    (lambda: mha(dtype=torch.bfloat16), "dtype"),  # same bytes per token
    (lambda: mha(dtype=torch.float8_e4m3fn, head_dim=16), "dtype"),
    (lambda: mla(kv_lora_rank=4, qk_rope_head_dim=4), "kind"),
]


@pytest.mark.parametrize("other, field", OTHERS, ids=[f for _, f in OTHERS])
def test_controller_refuses_host_pool_of_another_geometry(other, field):
    device_pool = mha()
    allocator = TokenToKVPoolAllocator(8, 2, "cpu", kvcache=device_pool)
    with pytest.raises(ValueError, match=rf"mem_pool_host.*{field}: host pool"):
        HiCacheController(allocator, host_for(other()), 2)
    assert device_pool.layer_transfer_counter is None, "registered before the check"
    ctrl = HiCacheController(allocator, host_for(device_pool), 2)
    ctrl.write(allocator.alloc(2), node_id=1)
    ctrl.start_writing()
    assert len(ctrl.ack_write_queue) == 1


def test_mla_controller_refuses_host_pool_of_other_latent_split():
    """Same kv_dim and bytes, another split of it into kv_lora_rank + qk_rope_head_dim."""
    device_pool = mla()
    allocator = TokenToKVPoolAllocator(8, 2, "cpu", kvcache=device_pool)
    with pytest.raises(ValueError, match="kv_lora_rank: host pool 8, device pool 12"):
        HiCacheController(allocator, host_for(mla(kv_lora_rank=8, qk_rope_head_dim=8)), 2)


def test_controller_refuses_host_pool_of_another_page_size():
    device_pool = mha()
    allocator = TokenToKVPoolAllocator(8, 2, "cpu", kvcache=device_pool)
    with pytest.raises(ValueError, match="page_size"):
        HiCacheController(allocator, host_for(mha(page_size=4)), 2)


def test_controller_accepts_another_pool_of_the_same_geometry():
    device_pool = mha()
    allocator = TokenToKVPoolAllocator(8, 2, "cpu", kvcache=device_pool)
    HiCacheController(allocator, host_for(mha()), 2)


@pytest.mark.parametrize("host", [object(), None, "layer_first"])
def test_controller_refuses_a_non_host_pool(host):
    allocator = TokenToKVPoolAllocator(8, 2, "cpu", kvcache=mha())
    with pytest.raises(TypeError, match="mem_pool_host"):
        HiCacheController(allocator, host, 2)


@pytest.mark.parametrize("other, field", OTHERS, ids=[f for _, f in OTHERS])
def test_host_pool_transfers_refuse_another_geometry(other, field):
    device_pool = mha()
    host = host_for(device_pool)
    wrong = other()
    slots = torch.arange(2, 4)
    before = host.kv_buffer.view(torch.uint8).clone()
    with pytest.raises(ValueError, match=rf"device_pool.*{field}: host pool"):
        host.backup_from_device_all_layer(wrong, slots, slots, "kernel")
    with pytest.raises(ValueError, match=rf"device_pool.*{field}: host pool"):
        host.load_to_device_per_layer(wrong, slots, slots, 0, "kernel")
    assert torch.equal(host.kv_buffer.view(torch.uint8), before)
