"""Conformance to SGLang's memory_pool.py: each class called the way SGLang's callers call it
(keyword names, positions), checked for the types, shapes, dtypes and semantics they rely on.

The whole-pool operations every KV pool shares are in ``test_sglang_conformance_ops.py``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hicache.pools import HybridReqToTokenPool, MambaPool, ReqToTokenPool
from tests.pools.helpers import DEVICES, fill_random
from tests.pools.mamba_helpers import FakeReq, RecordingCounter
from tests.pools.sglang_pools import cache_params, mamba_pool


def hybrid_req_pool(device: str = "cpu", extra: bool = True) -> HybridReqToTokenPool:
    return HybridReqToTokenPool(
        size=3,
        mamba_size=8,
        mamba_spec_state_size=8,
        max_context_len=16,
        device=device,
        enable_memory_saver=False,
        cache_params=cache_params(),
        enable_mamba_extra_buffer=extra,
        speculative_num_draft_tokens=None,
    )


def test_mamba_state_params_is_shaped_like_mamba2_cache_params() -> None:
    p = cache_params()
    assert p.layers == (0, 2) and p.shape.conv == ((6, 3),) and p.shape.temporal == (2, 4, 5)
    assert (p.dtype.conv, p.dtype.temporal) == (torch.bfloat16, torch.float32)
    assert p.mamba_cache_per_req == 2 * (6 * 3 * 2 + 2 * 4 * 5 * 4)


@pytest.mark.parametrize("device", DEVICES)
def test_mamba_pool_alloc_returns_zeroed_int64_slots_or_none(device: str) -> None:
    m = mamba_pool(device)
    fill_random([*m.mamba_cache.conv, m.mamba_cache.temporal], seed=1)
    got = m.alloc(3)
    assert got is not None and got.dtype == torch.int64 and got.dim() == 1
    assert got.device.type == device and sorted(got.tolist()) == [1, 2, 3]  # slot 0 pads
    for t in [*m.mamba_cache.conv, m.mamba_cache.temporal]:
        assert not t[:, got].view(torch.uint8).any()
        assert t[:, 4].view(torch.uint8).any()  # untouched slot keeps its bytes
    assert m.alloc(2) is None and m.available_size() == 1  # SGLang asserts; we return None
    m.free(got[:1])
    assert m.available_size() == 2
    m.clear()
    assert m.available_size() == m.size == 4


@pytest.mark.parametrize("device", DEVICES)
def test_mamba_layer_cache_views_the_pool(device: str) -> None:
    m = mamba_pool(device)
    state = m.mamba2_layer_cache(1)
    assert isinstance(state, MambaPool.State) and isinstance(state.conv, list)
    assert state.temporal.shape == (5, 2, 4, 5) and state.conv[0].shape == (5, 6, 3)
    state.temporal[2].fill_(3.5)  # a view: writes reach the pool
    assert bool((m.mamba_cache.temporal[1, 2] == 3.5).all())
    assert not m.mamba_cache.temporal[0, 2].any()
    assert m.mem_usage_bytes() == sum(
        t.nbytes for t in [*m.mamba_cache.conv, m.mamba_cache.temporal]
    )
    assert m.mem_usage == pytest.approx(m.mem_usage_bytes() / 2**30)
    assert state.mem_usage_bytes() * 2 == m.mem_usage_bytes()


def test_mamba_copy_and_fork_from() -> None:
    m = mamba_pool()
    src = m.alloc(1)
    assert src is not None
    fill_random([m.mamba_cache.temporal[:, src], m.mamba_cache.conv[0][:, src]], seed=2)
    m.mamba_cache.temporal[:, src] = torch.rand(2, 1, 2, 4, 5) + 1
    m.mamba_cache.conv[0][:, src] = (torch.rand(2, 1, 6, 3) + 1).to(torch.bfloat16)
    dst = m.fork_from(src)
    assert dst is not None and dst.dtype == torch.int64 and dst.numel() == 1
    for t in (m.mamba_cache.temporal, m.mamba_cache.conv[0]):
        assert torch.equal(t[:, dst], t[:, src])
    other = m.alloc(1)
    assert other is not None
    m.copy_from(src, other)
    assert torch.equal(m.mamba_cache.temporal[:, other], m.mamba_cache.temporal[:, src])
    m.alloc(m.available_size())
    assert m.fork_from(src) is None  # SGLang: None when alloc(1) fails


def test_mamba_speculative_state_and_buf_infos() -> None:
    m = mamba_pool(draft=3)
    spec = m.get_speculative_mamba2_params_all_layers()
    assert isinstance(spec, MambaPool.SpeculativeState) and isinstance(spec, MambaPool.State)
    assert spec.intermediate_ssm.shape == (2, 5, 3, 2, 4, 5)
    assert spec.intermediate_conv_window[0].shape == (2, 5, 3, 6, 3)
    layer = spec.at_layer_idx(0)
    assert type(layer) is MambaPool.SpeculativeState and layer.intermediate_ssm.shape[0] == 5
    ptrs, lens, items = m.get_contiguous_buf_infos()  # conv then temporal, layer by layer
    tensors = [m.mamba_cache.conv[0], m.mamba_cache.temporal]
    assert ptrs == [t[i].data_ptr() for t in tensors for i in range(2)]
    assert lens == [t[i].nbytes for t in tensors for i in range(2)]
    assert items == [t[i][0].nbytes for t in tensors for i in range(2)]
    assert all(isinstance(v, int) for v in ptrs + lens + items)
    assert m.get_state_dim_per_tensor() == [6, 6, 2, 2]
    with pytest.raises(ValueError):
        mamba_pool().get_speculative_mamba2_params_all_layers()


def test_req_to_token_pool_keeps_sglang_base_semantics() -> None:
    pool = ReqToTokenPool(size=3, max_context_len=8, device="cpu", enable_memory_saver=False)
    assert pool.req_to_token.shape == (3, 8) and pool.req_to_token.dtype == torch.int32
    rows = pool.alloc(need_size=2)
    assert isinstance(rows, list) and all(isinstance(r, int) for r in rows)
    assert pool.alloc(2) is None and pool.available_size() == 1
    pool.write((rows[0], slice(0, 3)), torch.tensor([7, 8, 9], dtype=torch.int32))
    assert pool.req_to_token[rows[0], :3].tolist() == [7, 8, 9]
    pool.free(free_index=rows[0])
    pool.free([rows[1]])
    assert pool.available_size() == 3
    with pytest.raises(ValueError, match="enable_memory_saver"):
        ReqToTokenPool(size=3, max_context_len=8, device="cpu", enable_memory_saver=True)


@pytest.mark.parametrize("device", DEVICES)
def test_hybrid_req_pool_alloc_maps_rows_to_state_slots(device: str) -> None:
    h = hybrid_req_pool(device)
    reqs = [FakeReq(), FakeReq()]
    rows = h.alloc(2, reqs)
    assert rows is not None and [r.req_pool_idx for r in reqs] == rows
    got = h.get_mamba_indices(torch.tensor(rows, device=device))
    assert got.dtype == torch.int32 and got.shape == (2,) and got.device.type == device
    assert got.tolist() == [int(r.mamba_pool_idx) for r in reqs]
    track = h.req_index_to_mamba_ping_pong_track_buffer_mapping
    assert track.dtype == torch.int32 and track.shape == (3, 2)
    assert track[rows[0]].tolist() == reqs[0].mamba_ping_pong_track_buffer.tolist()
    assert reqs[0].mamba_next_track_idx == 0 and h.get_mamba_ping_pong_other_idx(0) == 1
    # SGLang's radix cache forks a request's state: get_mamba_indices(row).unsqueeze(-1)
    one = h.get_mamba_indices(rows[0])
    assert one.dim() == 0 and one.dtype == torch.int32
    forked = h.mamba_pool.fork_from(one.unsqueeze(-1))
    assert forked is not None and forked.dtype == torch.int64
    h.mamba_pool.free(forked)


def test_mamba_layer_cache_waits_for_its_model_layer() -> None:
    h = hybrid_req_pool(extra=False)
    counter = RecordingCounter()
    h.register_layer_transfer_counter(counter)
    state = h.mamba2_layer_cache(2)  # model layer 2 is pool layer 1
    assert counter.waited == [2]
    assert state.temporal.data_ptr() == h.mamba_pool.mamba_cache.temporal[1].data_ptr()
    with pytest.raises(ValueError, match="layer_id"):
        h.mamba2_layer_cache(1)  # not a Mamba layer
    assert counter.waited == [2]


def test_hybrid_req_pool_free_and_exhaustion() -> None:
    h = hybrid_req_pool()  # 8 slots: 3 per request (state + 2 track)
    reqs = [FakeReq(), FakeReq()]
    rows = h.alloc(2, reqs)
    assert rows is not None and h.mamba_pool.available_size() == 2
    assert h.alloc(1, [FakeReq()]) is None  # 2 slots left, 3 needed: nothing taken
    assert (h.available_size(), h.mamba_pool.available_size()) == (1, 2)
    keep = int(reqs[0].mamba_ping_pong_track_buffer[1])
    h.free(free_index=rows[0], free_mamba_cache=True, mamba_ping_pong_track_buffer_to_keep=1)
    assert h.mamba_pool.available_size() == 4 and h.mamba_pool.is_allocated(keep)
    h.free(rows[1], free_mamba_cache=False)  # chunked prefill: slots stay with the request
    assert h.mamba_pool.available_size() == 4
    again = h.alloc(1, [reqs[1]])
    assert again is not None and h.mamba_pool.available_size() == 4  # slots reused
    h.clear()
    assert (h.available_size(), h.mamba_pool.available_size()) == (3, 8)


def test_mamba_state_is_a_frozen_keyword_dataclass() -> None:
    state = mamba_pool().mamba_cache
    assert dataclasses.is_dataclass(state) and [f.name for f in dataclasses.fields(state)] == [
        "conv",
        "temporal",
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.temporal = state.temporal  # type: ignore[misc]
