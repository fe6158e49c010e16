"""HybridReqToTokenPool: rows with Mamba state slots, reuse, ping-pong track slots, misuse."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import HybridReqToTokenPool, MambaPool
from tests.pools.helpers import DEVICES, as_bytes, fill_random
from tests.pools.mamba_helpers import FakeReq, RecordingCounter, params, slot_ids


def hybrid(
    device: str = "cpu", size: int = 3, mamba_size: int = 7, extra: bool = True, **kw: object
) -> HybridReqToTokenPool:
    return HybridReqToTokenPool(
        size=size,
        mamba_size=mamba_size,
        max_context_len=8,
        device=device,
        cache_params=params(),
        enable_mamba_extra_buffer=extra,
        **kw,  # type: ignore[arg-type]
    )


def states(m: MambaPool) -> list[torch.Tensor]:
    return [*m.mamba_cache.conv, m.mamba_cache.temporal]


@pytest.mark.parametrize("device", DEVICES)
def test_alloc_binds_rows_state_and_track_slots(device: str) -> None:
    h = hybrid(device)
    reqs = [FakeReq(), FakeReq()]
    rows = h.alloc(2, reqs)
    assert rows is not None and [r.req_pool_idx for r in reqs] == rows
    held = [slot_ids(r) for r in reqs]
    assert sorted(s for ids in held for s in ids) == [1, 2, 3, 4, 5, 6]
    assert all(r.mamba_next_track_idx == 0 for r in reqs)
    assert reqs[0].mamba_pool_idx is not None and reqs[0].mamba_pool_idx.device.type == device
    got = h.get_mamba_indices(torch.tensor(rows, device=device))
    assert got.tolist() == [ids[0] for ids in held] and got.dtype == torch.int32
    table = h.req_index_to_mamba_ping_pong_track_buffer_mapping
    assert table[rows].tolist() == [ids[1:] for ids in held]
    assert h.mamba_pool.available_size() == 1


def test_chunked_request_keeps_its_state_across_rows() -> None:
    h = hybrid()
    req = FakeReq()
    assert h.alloc(1, [req]) is not None
    held, row = slot_ids(req), req.req_pool_idx
    fill_random(states(h.mamba_pool), seed=4)
    before = [t.clone() for t in states(h.mamba_pool)]
    h.free(row, free_mamba_cache=False)  # the chunk ends; the request keeps its slots
    assert h.mamba_pool.available_size() == 4
    rows = h.alloc(1, [req])
    assert rows is not None and slot_ids(req) == held and h.mamba_pool.available_size() == 4
    assert all(
        torch.equal(as_bytes(t), as_bytes(b))
        for t, b in zip(states(h.mamba_pool), before, strict=True)
    )
    assert h.get_mamba_indices(torch.tensor(rows)).tolist() == held[:1]


def test_free_frees_the_rows_slots_but_the_kept_track_slot() -> None:
    h = hybrid()
    req = FakeReq()
    assert h.alloc(1, [req]) is not None
    state, track0, track1 = slot_ids(req)
    h.free(req.req_pool_idx, mamba_ping_pong_track_buffer_to_keep=1)
    assert h.available_size() == 3 and h.mamba_pool.available_size() == 6
    assert h.mamba_pool.is_allocated(track1) and not h.mamba_pool.is_allocated(state)
    assert not h.mamba_pool.is_allocated(track0)


def test_free_mamba_cache_clears_the_request_and_its_row_forgets_the_slots() -> None:
    h = hybrid()
    req = FakeReq()
    assert h.alloc(1, [req]) is not None
    kept = slot_ids(req)[1]
    h.free_mamba_cache(req, mamba_ping_pong_track_buffer_to_keep=0)
    assert req.mamba_pool_idx is None and req.mamba_ping_pong_track_buffer is None
    assert h.mamba_pool.available_size() == 6 and h.mamba_pool.is_allocated(kept)
    with pytest.raises(ValueError, match="mamba_pool_idx"):
        h.free_mamba_cache(req)  # double free
    h.free(req.req_pool_idx)  # the row no longer maps freed slots: nothing freed twice
    assert h.available_size() == 3 and h.mamba_pool.available_size() == 6


def test_ping_pong_indices() -> None:
    h = hybrid()
    assert [h.get_mamba_ping_pong_other_idx(i) for i in (0, 1)] == [1, 0]
    spec = hybrid(speculative_num_draft_tokens=2)
    assert spec.mamba_ping_pong_track_buffer_size == 1
    assert spec.get_mamba_ping_pong_other_idx(0) == 0
    req = FakeReq()
    assert spec.alloc(1, [req]) is not None and len(slot_ids(req)) == 2
    assert isinstance(spec.get_speculative_mamba2_params_all_layers(), MambaPool.SpeculativeState)
    with pytest.raises(ValueError, match="mamba_next_track_idx"):
        spec.get_mamba_ping_pong_other_idx(1)


@pytest.mark.parametrize(("size", "mamba_size"), [(1, 7), (3, 5)])
def test_exhaustion_returns_none_and_takes_nothing(size: int, mamba_size: int) -> None:
    h = hybrid(size=size, mamba_size=mamba_size)
    reqs = [FakeReq(), FakeReq()]  # 2 rows, 6 state slots
    assert h.alloc(2, reqs) is None
    assert h.available_size() == size and h.mamba_pool.available_size() == mamba_size
    assert reqs == [FakeReq(), FakeReq()]


def test_without_extra_buffer_only_state_slots() -> None:
    h = hybrid(extra=False)
    req = FakeReq()
    assert h.alloc(1, [req]) is not None and req.mamba_ping_pong_track_buffer is None
    assert h.mamba_pool.available_size() == 6
    with pytest.raises(ValueError, match="mamba_ping_pong_track_buffer_to_keep"):
        h.free(req.req_pool_idx, mamba_ping_pong_track_buffer_to_keep=0)
    h.free(req.req_pool_idx)
    assert h.mamba_pool.available_size() == 7


def test_layer_cache_maps_model_layers_and_waits() -> None:
    h, counter = hybrid(), RecordingCounter()
    h.register_layer_transfer_counter(counter)
    layer = h.mamba2_layer_cache(3)
    assert counter.waited == [3]
    assert layer.temporal.data_ptr() == h.mamba_pool.mamba_cache.temporal[1].data_ptr()
    with pytest.raises(ValueError, match="layer_id"):
        h.mamba2_layer_cache(0)


def test_clear_frees_everything() -> None:
    h = hybrid()
    assert h.alloc(2, [FakeReq(), FakeReq()]) is not None
    h.clear()
    assert h.available_size() == 3 and h.mamba_pool.available_size() == 7
    assert int(h.req_index_to_mamba_index_mapping.abs().sum()) == 0
    assert h.alloc(2, [FakeReq(), FakeReq()]) is not None


def _misuse_cases() -> list[tuple[object, type, str]]:
    def other_row(h: HybridReqToTokenPool, live: FakeReq) -> None:
        h.alloc(1, [FakeReq(mamba_pool_idx=live.mamba_pool_idx)])

    return [
        (lambda h, live: h.alloc(1), TypeError, "reqs"),
        (lambda h, live: h.alloc(2, [FakeReq()]), ValueError, "reqs"),
        (lambda h, live: h.alloc(1, [object()]), TypeError, r"reqs\[0\]"),
        (lambda h, live: h.alloc(1, [FakeReq(mamba_pool_idx=torch.tensor(7))]), ValueError, "kept"),
        (lambda h, live: h.alloc(1, [FakeReq(mamba_pool_idx=torch.tensor(9))]), IndexError, "kept"),
        (lambda h, live: h.alloc(1, [FakeReq(mamba_pool_idx=1.0)]), TypeError, "mamba_pool_idx"),
        (other_row, ValueError, "live rows"),
        (
            lambda h, live: h.alloc(1, [FakeReq(mamba_ping_pong_track_buffer=torch.tensor([1]))]),
            ValueError,
            "mamba_ping_pong_track_buffer",
        ),
        (lambda h, live: h.free(2), ValueError, "free_index"),
        (lambda h, live: h.free(0, mamba_ping_pong_track_buffer_to_keep=2), ValueError, "keep"),
        (lambda h, live: h.free_mamba_cache(object()), TypeError, "req"),
        (
            lambda h, live: h.get_mamba_indices(torch.tensor([0], dtype=torch.int16)),
            TypeError,
            "req_indices",
        ),
        (lambda h, live: h.get_mamba_indices(torch.tensor([3])), IndexError, "req_indices"),
    ]


@pytest.mark.parametrize(("call", "error", "name"), _misuse_cases())
def test_misuse_raises_before_any_change(call: object, error: type, name: str) -> None:
    h = hybrid()
    live = FakeReq()
    assert h.alloc(1, [live]) is not None  # row 0, slots 1-3
    rows, slots = h.available_size(), h.mamba_pool.available_size()
    with pytest.raises(error, match=name):
        call(h, live)  # type: ignore[operator]
    assert (h.available_size(), h.mamba_pool.available_size()) == (rows, slots)
    assert slot_ids(live) == [1, 2, 3] and live.req_pool_idx == 0
    h.free(0)  # a correct call afterwards works
    assert (h.available_size(), h.mamba_pool.available_size()) == (3, 7)
