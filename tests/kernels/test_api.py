"""The public surface: the 13 ops, their parameter names, order and defaults."""

from __future__ import annotations

import inspect

import pytest
import torch

import hicache.kernels as K
from hicache.kernels.dispatch import force_backend

NW = 16 if torch.version.hip else 32
IDX = ["src_indices", "dst_indices"]
LAUNCH = ["block_quota", "num_warps_per_block"]
MHA = ["src_k", "dst_k", "src_v", "dst_v"]
MHA_TABLES = ["src_k_layers", "dst_k_layers", "src_v_layers", "dst_v_layers"]
MHA_LF_PF = ["src_k_layers", "dst_k", "src_v_layers", "dst_v"]
SIGNATURES = {
    "transfer_kv_per_layer": MHA + IDX + ["item_size"] + LAUNCH,
    "transfer_kv_per_layer_pf_lf": MHA + IDX + ["layer_id", "item_size", "src_layout_dim"] + LAUNCH,
    "transfer_kv_per_layer_ph_lf": MHA
    + IDX
    + ["layer_id", "item_size", "src_layout_dim", "page_size", "head_num"]
    + LAUNCH,
    "transfer_kv_all_layer": MHA_TABLES + IDX + ["item_size", "num_layers"] + LAUNCH,
    "transfer_kv_all_layer_lf_pf": MHA_LF_PF
    + IDX
    + ["item_size", "dst_layout_dim", "num_layers"]
    + LAUNCH,
    "transfer_kv_all_layer_lf_ph": MHA_LF_PF
    + IDX
    + ["item_size", "dst_layout_dim", "num_layers", "page_size", "head_num"]
    + LAUNCH,
    "transfer_kv_per_layer_mla": ["src", "dst"] + IDX + ["item_size"] + LAUNCH,
    "transfer_kv_per_layer_mla_pf_lf": ["src", "dst"]
    + IDX
    + ["layer_id", "item_size", "src_layout_dim"]
    + LAUNCH,
    "transfer_kv_all_layer_mla": ["src_layers", "dst_layers"]
    + IDX
    + ["item_size", "num_layers"]
    + LAUNCH,
    "transfer_kv_all_layer_mla_lf_pf": ["src_layers", "dst"]
    + IDX
    + ["item_size", "dst_layout_dim", "num_layers"]
    + LAUNCH,
    "transfer_kv_direct": ["src_layers", "dst_layers"] + IDX + ["page_size"],
    "transfer_kv_per_layer_direct_pf_lf": ["src_ptrs", "dst_ptrs"]
    + IDX
    + ["layer_id", "page_size"],
    "transfer_kv_all_layer_direct_lf_pf": ["src_ptrs", "dst_ptrs"] + IDX + ["page_size"],
}

# Keyword-only additions (issue 12): the item count behind each pointer table, default None.
BOTH_TABLES = ["src_items_per_layer", "dst_items_per_layer"]
KEYWORD_ONLY = {
    "transfer_kv_all_layer": BOTH_TABLES,
    "transfer_kv_all_layer_mla": BOTH_TABLES,
    "transfer_kv_all_layer_lf_pf": ["src_items_per_layer"],
    "transfer_kv_all_layer_lf_ph": ["src_items_per_layer"],
    "transfer_kv_all_layer_mla_lf_pf": ["src_items_per_layer"],
}


def test_all_thirteen_ops_are_exported():
    ops = {name for name in K.__all__ if name.startswith("transfer_kv")}
    assert ops == set(SIGNATURES)


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature(name):
    params = inspect.signature(getattr(K, name)).parameters
    keyword_only = [k for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert [k for k in params if k not in keyword_only] == SIGNATURES[name]
    assert keyword_only == KEYWORD_ONLY.get(name, [])
    defaults = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
    assert defaults == (
        {"block_quota": 2, "num_warps_per_block": NW} if "block_quota" in params else {}
    ) | dict.fromkeys(keyword_only)


def test_force_backend_rejects_unknown_names():
    with pytest.raises(ValueError, match="backend"):
        with force_backend("cuda"):
            pass
