"""Every kernel op on CPU tensors (the torch reference) against the slow per-item oracle."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.cases import PH_SPECS, SPECS, Config, assert_bytes_equal, build, run

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.uint8]  # uint8: fp8 storage


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_op_matches_oracle(spec, dtype):
    case = build(spec, Config(dtype=dtype))
    assert_bytes_equal(run(case), case.expected())


@pytest.mark.parametrize("pattern", ["random", "runs"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("spec", PH_SPECS, ids=str)
def test_page_head_page_sizes(spec, page_size, pattern):
    items = max(64, 2 * page_size)
    cfg = Config(
        dtype=torch.bfloat16,
        heads=4,
        page_size=page_size,
        src_items=items,
        dst_items=items,
        n=page_size * (items // page_size // 2) if pattern == "runs" else 40,
        pattern=pattern,
    )
    case = build(spec, cfg)
    assert_bytes_equal(run(case), case.expected())


@pytest.mark.parametrize("layer_id", [0, 1, 3])
@pytest.mark.parametrize("spec", [s for s in SPECS if s.src in ("pf", "ph")], ids=str)
def test_per_layer_ops_pick_their_layer(spec, layer_id):
    case = build(spec, Config(layers=4, layer_id=layer_id, page_size=16))
    assert_bytes_equal(run(case), case.expected())


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_empty_indices_change_nothing(spec):
    case = build(spec, Config(n=0))
    assert_bytes_equal(run(case), case.expected())


def test_mla_with_realistic_latent_width():
    spec = next(s for s in SPECS if s.name == "transfer_kv_all_layer_mla_lf_pf")
    case = build(spec, Config(dtype=torch.bfloat16, head_dim=576, layers=2))
    assert_bytes_equal(run(case), case.expected())
