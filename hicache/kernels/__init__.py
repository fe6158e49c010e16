"""hicache.kernels: the 13 KV transfer ops between layer_first, page_first, page_first_direct and
page_head buffers (Triton on CUDA, a torch reference on the CPU). See :mod:`hicache.kernels.ops`
for the contract shared by the kernel ops and :mod:`hicache.kernels.direct` for the direct ones.
:mod:`hicache.kernels.layer_plan` and :mod:`hicache.kernels.direct_plan` plan a per-layer op once
for every layer of a load batch (``plan_*``), so each layer only launches.
The page checksums behind the host tier's ``verify`` are internal: :mod:`hicache.kernels.checksum`.
"""

from hicache.kernels.all_layer_ops import (
    transfer_kv_all_layer,
    transfer_kv_all_layer_lf_pf,
    transfer_kv_all_layer_lf_ph,
    transfer_kv_all_layer_mla,
    transfer_kv_all_layer_mla_lf_pf,
)
from hicache.kernels.direct import (
    transfer_kv_all_layer_direct_lf_pf,
    transfer_kv_direct,
    transfer_kv_per_layer_direct_pf_lf,
)
from hicache.kernels.direct_plan import DirectLayerPlan, plan_direct, plan_direct_pf_lf
from hicache.kernels.layer_plan import (
    LayerPlan,
    plan_per_layer,
    plan_per_layer_pf_lf,
    plan_per_layer_ph_lf,
)
from hicache.kernels.ops import (
    DEFAULT_NUM_WARPS,
    transfer_kv_per_layer,
    transfer_kv_per_layer_mla,
    transfer_kv_per_layer_mla_pf_lf,
    transfer_kv_per_layer_pf_lf,
    transfer_kv_per_layer_ph_lf,
)

__all__ = [
    "DEFAULT_NUM_WARPS",
    "DirectLayerPlan",
    "LayerPlan",
    "plan_direct",
    "plan_direct_pf_lf",
    "plan_per_layer",
    "plan_per_layer_pf_lf",
    "plan_per_layer_ph_lf",
    "transfer_kv_all_layer",
    "transfer_kv_all_layer_direct_lf_pf",
    "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph",
    "transfer_kv_all_layer_mla",
    "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct",
    "transfer_kv_per_layer",
    "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_per_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf",
    "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
]
