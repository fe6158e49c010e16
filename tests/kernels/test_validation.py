"""Bad arguments: the right exception, naming the argument, and the destination untouched."""

from __future__ import annotations

import pytest
import torch

import hicache.kernels as K
from tests.kernels.cases import SPECS, Config, as_bytes, build, prepare

SPEC = {s.name: s for s in SPECS}


def assert_rejected(name, overrides, exc, match, **cfg):
    case = build(SPEC[name], Config(**cfg))
    call = prepare(case)
    before = [as_bytes(b) for b in call.dst]
    kwargs = dict(call.kwargs)
    kwargs.update(overrides(kwargs) if callable(overrides) else overrides)
    with pytest.raises(exc, match=match):
        case.spec.op(**kwargs)
    after = [as_bytes(b) for b in call.dst]
    assert all(
        torch.equal(a, b)
        for x, y in zip(before, after, strict=True)
        for a, b in zip(x, y, strict=True)
    ), "the destination changed"


PF = "transfer_kv_per_layer_pf_lf"
BAD_PER_LAYER = [
    ({"src_indices": lambda kw: kw["src_indices"].int()}, TypeError, "src_indices"),
    ({"dst_indices": lambda kw: kw["dst_indices"].tolist()}, TypeError, "dst_indices"),
    ({"src_indices": lambda kw: kw["src_indices"][None]}, ValueError, "src_indices"),
    ({"dst_indices": lambda kw: kw["dst_indices"][:-1]}, ValueError, "differ in length"),
    ({"src_indices": lambda kw: torch.full_like(kw["src_indices"], 64)}, IndexError, "src_indices"),
    ({"dst_indices": lambda kw: -kw["dst_indices"] - 1}, IndexError, "dst_indices"),
    ({"item_size": lambda kw: 12}, ValueError, "item_size"),
    ({"item_size": lambda kw: 32.0}, TypeError, "item_size"),
    ({"item_size": lambda kw: True}, TypeError, "item_size"),
    ({"src_layout_dim": lambda kw: kw["src_layout_dim"] + 8}, ValueError, "src_layout_dim"),
    ({"layer_id": lambda kw: 3}, IndexError, "layer_id"),
    ({"layer_id": lambda kw: -1}, ValueError, "layer_id"),
    ({"dst_k": lambda kw: kw["dst_k"].view(torch.bfloat16)}, ValueError, "dst_k"),
    ({"src_v": lambda kw: kw["src_v"][:-1]}, ValueError, "src_v"),
    ({"dst_v": lambda kw: kw["dst_v"].transpose(1, 2)}, ValueError, "dst_v"),
    ({"src_k": lambda kw: kw["src_k"].numpy()}, TypeError, "src_k"),
    ({"block_quota": lambda kw: 0}, ValueError, "block_quota"),
    ({"num_warps_per_block": lambda kw: 3}, ValueError, "num_warps_per_block"),
    ({"num_warps_per_block": lambda kw: 64}, ValueError, "num_warps_per_block"),
]


@pytest.mark.parametrize(
    "override, exc, match",
    BAD_PER_LAYER,
    ids=[f"{i}-{case[2]}" for i, case in enumerate(BAD_PER_LAYER)],
)
def test_per_layer_pf_lf_rejects(override, exc, match):
    assert_rejected(PF, lambda kw: {k: f(kw) for k, f in override.items()}, exc, match)


def test_item_size_inconsistent_with_tensors():
    assert_rejected("transfer_kv_per_layer", {"item_size": 64}, ValueError, "src_k")


@pytest.mark.parametrize(
    "override, match",
    [
        ({"head_num": 3}, "head_num"),
        ({"page_size": 0}, "page_size"),
        ({"page_size": 8}, "src_k"),  # the tensor's pages hold 16 slots
    ],
)
def test_page_head_rejects(override, match):
    assert_rejected("transfer_kv_per_layer_ph_lf", override, ValueError, match, page_size=16)


ALL = "transfer_kv_all_layer_lf_pf"
BAD_ALL_LAYER = [
    ({"src_k_layers": lambda kw: kw["src_k_layers"].view(torch.int64)}, TypeError, "src_k_layers"),
    ({"src_v_layers": lambda kw: kw["src_v_layers"][:-1]}, ValueError, "src_v_layers"),
    ({"src_v_layers": lambda kw: torch.zeros_like(kw["src_v_layers"])}, ValueError, "src_v_layers"),
    ({"dst_layout_dim": lambda kw: kw["dst_layout_dim"] * 2}, ValueError, "dst_layout_dim"),
    ({"num_layers": lambda kw: 0}, ValueError, "num_layers"),
    ({"dst_indices": lambda kw: kw["dst_indices"] + 48}, IndexError, "dst_indices"),
]


@pytest.mark.parametrize(
    "override, exc, match",
    BAD_ALL_LAYER,
    ids=[f"{i}-{case[2]}" for i, case in enumerate(BAD_ALL_LAYER)],
)
def test_all_layer_lf_pf_rejects(override, exc, match):
    assert_rejected(ALL, lambda kw: {k: f(kw) for k, f in override.items()}, exc, match)


def test_mla_messages_name_mla_arguments():
    assert_rejected(
        "transfer_kv_per_layer_mla", lambda kw: {"dst": kw["dst"].float()}, ValueError, "dst"
    )


def direct_args():
    src = [torch.rand(32, 2, 8) for _ in range(2)]
    dst = [torch.zeros(32, 2, 8) for _ in range(2)]
    return src, dst, torch.arange(8), torch.arange(8, 16)


@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda a: (*a[:4], 3), ValueError, "page_size"),
        (lambda a: (a[0], a[1][:1], *a[2:]), ValueError, "dst_layers"),
        (lambda a: (a[0], [t[:, :1] for t in a[1]], *a[2:]), ValueError, r"src_layers\[0\]"),
        (lambda a: (tuple(), *a[1:]), TypeError, "src_layers"),
        (lambda a: (*a[:3], a[3] + 24, 4), IndexError, "dst_indices"),
        (lambda a: (*a[:2], a[2].int(), *a[3:]), TypeError, "src_indices"),
    ],
    ids=["page_multiple", "count", "slot_shape", "empty", "range", "dtype"],
)
def test_direct_rejects(mutate, exc, match):
    src, dst, s, d = direct_args()
    before = [t.clone() for t in dst]
    args = mutate((src, dst, s, d, 4))
    with pytest.raises(exc, match=match):
        K.transfer_kv_direct(*args)
    assert all(torch.equal(a, b) for a, b in zip(before, dst, strict=True))


def test_per_layer_direct_rejects_bad_layer_and_page_dim():
    host = [torch.rand(4, 3, 4, 2, 8)]
    dev = [torch.zeros(16, 2, 8)]
    idx = torch.arange(4)
    with pytest.raises(IndexError, match="layer_id"):
        K.transfer_kv_per_layer_direct_pf_lf(host, dev, idx, idx, 3, 4)
    with pytest.raises(ValueError, match=r"src_ptrs\[0\]"):
        K.transfer_kv_per_layer_direct_pf_lf(host, dev, idx, idx, 0, 2)
    assert not dev[0].any()


def test_all_layer_direct_rejects_wrong_layer_count():
    # fewer layers than the host buffer holds are written (as sgl-kernel); more, or a count
    # that does not split evenly over the buffers, are refused
    host = [torch.zeros(4, 3, 4, 2, 8)]
    with pytest.raises(ValueError, match="src_ptrs holds 4 layers"):
        K.transfer_kv_all_layer_direct_lf_pf(
            [torch.rand(16, 2, 8)] * 4, host, torch.arange(4), torch.arange(4), 4
        )
    with pytest.raises(ValueError, match="src_ptrs must hold a multiple of len.dst_ptrs. = 2"):
        K.transfer_kv_all_layer_direct_lf_pf(
            [torch.rand(16, 2, 8)] * 3, host * 2, torch.arange(4), torch.arange(4), 4
        )
    assert not host[0].any()
