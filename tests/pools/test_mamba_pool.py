"""MambaStateParams and MambaPool against plain-torch references on random states."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hicache.pools import MambaPool, MambaStateParams
from tests.pools.helpers import DEVICES, POISON, as_bytes, fill_random, poison
from tests.pools.mamba_helpers import RecordingCounter, params

DTYPE_PAIRS = [(torch.bfloat16, torch.float32), (torch.float16, torch.float16)]


def pool(device: str = "cpu", size: int = 5, **kw: object) -> MambaPool:
    return MambaPool(size=size, cache_params=params(), device=device, **kw)  # type: ignore[arg-type]


def states(p: MambaPool) -> list[torch.Tensor]:
    return [*p.mamba_cache.conv, p.mamba_cache.temporal]


def idx(*slots: int) -> torch.Tensor:
    return torch.tensor(slots, dtype=torch.int64)


@pytest.mark.parametrize(("conv_dtype", "temporal_dtype"), DTYPE_PAIRS)
def test_mamba_cache_per_req_is_the_bytes_of_one_request(
    conv_dtype: torch.dtype, temporal_dtype: torch.dtype
) -> None:
    p = params(conv_dtype, temporal_dtype)
    by_hand = 2 * ((6 * 3 + 4 * 3) * conv_dtype.itemsize + 2 * 3 * 5 * temporal_dtype.itemsize)
    assert p.mamba_cache_per_req == by_hand
    m = MambaPool(size=3, cache_params=p, device="cpu")
    assert sum(info.row_bytes for info in m.state_tensors) * 2 == by_hand
    assert p.shape.conv == ((6, 3), (4, 3)) and p.shape.temporal == (2, 3, 5)
    assert p.dtype == (conv_dtype, temporal_dtype) and p.layers == (1, 3)


@pytest.mark.parametrize(
    ("kw", "error", "name"),
    [
        ({"layers": []}, ValueError, "layers"),
        ({"layers": [1, 1]}, ValueError, "layers"),
        ({"layers": [-1]}, ValueError, "layers[0]"),
        ({"layers": [True]}, TypeError, "layers[0]"),
        ({"conv": []}, ValueError, "conv"),
        ({"conv": [(6, 0)]}, ValueError, "conv[0][1]"),
        ({"temporal": (2, 3)}, ValueError, "temporal"),
        ({"temporal": (2, 3, 2.0)}, TypeError, "temporal[2]"),
        ({"conv_dtype": torch.int32}, TypeError, "conv_dtype"),
        ({"temporal_dtype": "float32"}, TypeError, "temporal_dtype"),
    ],
)
def test_params_refuse_bad_values(kw: dict[str, object], error: type, name: str) -> None:
    args: dict[str, object] = {"layers": [0], "conv": [(4, 3)], "temporal": (1, 2, 3), **kw}
    with pytest.raises(error, match=name.replace("[", r"\[")):
        MambaStateParams(**args)  # type: ignore[arg-type]


def test_params_are_frozen_and_hashable() -> None:
    p = params()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.layers = (0,)  # type: ignore[misc]
    assert hash(p) == hash(params())


@pytest.mark.parametrize("device", DEVICES)
def test_layout_is_layers_by_rows_and_slot_zero_pads(device: str) -> None:
    m = pool(device)
    assert [tuple(t.shape) for t in states(m)] == [(2, 6, 6, 3), (2, 6, 4, 3), (2, 6, 2, 3, 5)]
    got = m.alloc(5)
    assert got is not None and sorted(got.tolist()) == [1, 2, 3, 4, 5]
    assert got.dtype == torch.int64 and got.device.type == device
    assert m.alloc(1) is None and m.available_size() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_alloc_zeroes_exactly_the_states_it_hands_out(device: str) -> None:
    m = pool(device)
    for t in states(m):
        poison(t)
    got = m.alloc(2)
    assert got is not None
    for t in states(m):
        rows = as_bytes(t.transpose(0, 1)).reshape(t.shape[1], -1)
        taken = torch.zeros(t.shape[1], dtype=torch.bool)
        taken[got.cpu()] = True
        assert bool((rows[taken] == 0).all()) and bool((rows[~taken] == POISON).all())


@pytest.mark.parametrize("device", DEVICES)
def test_copy_from_matches_a_reference(device: str) -> None:
    m = pool(device)
    assert m.alloc(5) is not None
    fill_random(states(m), seed=1)
    before = [t.clone() for t in states(m)]
    src, dst = idx(2, 4, 4), idx(4, 1, 5)  # dst 4 is also a source: read before written
    m.copy_from(src.to(device), dst.to(device))
    for t, ref in zip(states(m), before, strict=True):
        expect = ref.clone()
        for s, d in zip(src.tolist(), dst.tolist(), strict=True):
            expect[:, d] = ref[:, s]
        assert torch.equal(as_bytes(t), as_bytes(expect))


@pytest.mark.parametrize("device", DEVICES)
def test_fork_from_copies_into_new_slots_and_returns_none_when_full(device: str) -> None:
    m = pool(device, size=3)
    src = m.alloc(1)
    assert src is not None
    fill_random(states(m), seed=2)
    forked = m.fork_from(src)
    assert forked is not None and forked.tolist() != src.tolist()
    for t in states(m):
        assert torch.equal(as_bytes(t[:, forked]), as_bytes(t[:, src]))
    assert m.fork_from(idx(*src.tolist(), *forked.tolist())) is None  # 2 needed, 1 free
    assert m.available_size() == 1


def test_speculative_state_shapes_and_layer_views() -> None:
    m = pool(size=4, spec_state_size=2, speculative_num_draft_tokens=3)
    spec = m.get_speculative_mamba2_params_all_layers()
    assert isinstance(spec, MambaPool.SpeculativeState)
    assert tuple(spec.intermediate_ssm.shape) == (2, 3, 3, 2, 3, 5)
    assert [tuple(t.shape) for t in spec.intermediate_conv_window] == [
        (2, 3, 3, 6, 3),
        (2, 3, 3, 4, 3),
    ]
    assert spec.intermediate_ssm.dtype == torch.float32
    layer = m.mamba2_layer_cache(1)
    assert isinstance(layer, MambaPool.SpeculativeState)
    assert layer.temporal.data_ptr() == spec.temporal[1].data_ptr()
    assert (
        layer.intermediate_conv_window[1].data_ptr()
        == spec.intermediate_conv_window[1][1].data_ptr()
    )
    assert m.mem_usage_bytes() == sum(t.nbytes for t in spec.tensors())
    with pytest.raises(ValueError, match="speculative"):
        pool().get_speculative_mamba2_params_all_layers()


@pytest.mark.parametrize("device", DEVICES)
def test_buf_infos_describe_every_layer_of_every_state_tensor(device: str) -> None:
    m = pool(device, speculative_num_draft_tokens=2)  # speculative buffers are left out
    ptrs, lens, items = m.get_contiguous_buf_infos()
    layers = [t[layer] for t in states(m) for layer in range(2)]
    assert ptrs == [t.data_ptr() for t in layers]
    assert lens == [t.nbytes for t in layers] and items == [t[0].nbytes for t in layers]
    assert m.get_state_dim_per_tensor() == [6, 6, 4, 4, 2, 2]
    assert [i.name for i in m.state_tensors] == ["conv0", "conv1", "temporal"]
    assert [i.row_bytes for i in m.state_tensors] == [36, 24, 120]
    assert [b.data_ptr() for bufs in m.row_buffers for b in bufs] == ptrs


def test_layer_cache_waits_on_the_model_layer() -> None:
    m, counter = pool(), RecordingCounter()
    m.register_layer_transfer_counter(counter)
    layer = m.mamba2_layer_cache(1)
    assert counter.waited == [3] and layer.conv[0].data_ptr() == m.mamba_cache.conv[0][1].data_ptr()
    with pytest.raises(IndexError, match="layer_id"):
        m.mamba2_layer_cache(2)
    with pytest.raises(TypeError, match="layer_id"):
        m.mamba2_layer_cache(True)
    with pytest.raises(TypeError, match="counter"):
        m.register_layer_transfer_counter(object())  # type: ignore[arg-type]
    assert counter.waited == [3]


def test_free_and_clear_return_slots() -> None:
    m = pool()
    got = m.alloc(3)
    assert got is not None
    m.free(got[:2])
    m.free(idx())
    assert m.available_size() == 4 and m.is_allocated(int(got[2]))
    m.clear()
    assert m.available_size() == 5 and not m.is_allocated(int(got[2]))


@pytest.mark.parametrize(
    ("call", "error", "name"),
    [
        (lambda m: m.free(idx(1, 1)), ValueError, "free_index"),
        (lambda m: m.free(idx(3)), ValueError, "freed already"),
        (lambda m: m.free(idx(0)), IndexError, "free_index"),
        (lambda m: m.free(idx(6)), IndexError, "free_index"),
        (lambda m: m.free(idx(1).to(torch.int16)), TypeError, "free_index"),
        (lambda m: m.free(idx(1, 2).reshape(1, 2)), ValueError, "free_index"),
        (lambda m: m.free([1]), TypeError, "free_index"),
        (lambda m: m.copy_from(idx(1), idx(1, 2)), ValueError, "length"),
        (lambda m: m.copy_from(idx(1), idx(3)), ValueError, "dst_index"),
        (lambda m: m.copy_from(idx(3), idx(1)), ValueError, "src_index"),
        (lambda m: m.copy_from(idx(1, 2), idx(2, 2)), ValueError, "dst_index"),
        (lambda m: m.fork_from(idx(4)), ValueError, "src_index"),
        (lambda m: m.alloc(-1), ValueError, "need_size"),
        (lambda m: m.alloc(1.0), TypeError, "need_size"),
    ],
)
def test_misuse_raises_before_any_change(call: object, error: type, name: str) -> None:
    m = pool()
    assert m.alloc(2) is not None  # slots 1 and 2
    fill_random(states(m), seed=3)
    before = [t.clone() for t in states(m)]
    with pytest.raises(error, match=name):
        call(m)  # type: ignore[operator]
    assert m.available_size() == 3 and m.is_allocated(1) and m.is_allocated(2)
    assert all(
        torch.equal(as_bytes(t), as_bytes(b)) for t, b in zip(states(m), before, strict=True)
    )
    m.free(idx(1, 2))  # a correct call afterwards works
    assert m.available_size() == 5


@pytest.mark.parametrize(
    ("kw", "error", "name"),
    [
        ({"size": 0}, ValueError, "size"),
        ({"cache_params": {"layers": [0]}}, TypeError, "cache_params"),
        ({"enable_memory_saver": True}, ValueError, "enable_memory_saver"),
        ({"speculative_num_draft_tokens": 0}, ValueError, "speculative_num_draft_tokens"),
        ({"spec_state_size": 0}, ValueError, "spec_state_size"),
        ({"device": "nowhere"}, ValueError, "device"),
    ],
)
def test_constructor_refuses_bad_arguments(kw: dict[str, object], error: type, name: str) -> None:
    args: dict[str, object] = {"size": 4, "cache_params": params(), "device": "cpu", **kw}
    with pytest.raises(error, match=name):
        MambaPool(**args)  # type: ignore[arg-type]
