#!/usr/bin/env bash
# Issue 35: where the CUDA prefill step with a host hit spends its CPU, by caller and callee
# (benchmarks/probes/step_profile.py under cProfile; ~1 min). Logs under $OUT.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
CALLEES='^(issue_write|issue_load|backup_from_device_all_layer|transfer_kv_all_layer|_mha_backup_lf|through|plan_load|plan|transfer_indices|cache_finished_req|init_load_back|_prepare|all_layer|prepare|launch|run|start_writing|start_loading|settle|_settle|alloc|alloc_pair|write|_store|to_device|load|match_prefix|cat_slots|concat_slots) '
CALLERS="pin_memory|'to' of|torch.cat|arange|Event.record|record_stream|index_select|'numpy' of|torch.tensor|'copy_' of|Event.query|empty|__triton_launcher|jit.py"
timeout 120 python3 benchmarks/probes/step_profile.py --device "${DEVICE:-cuda}" --steps 200 \
  --rows 40 --callers "$CALLERS" --callees "$CALLEES" > "$OUT/prof.log" 2>&1
head -90 "$OUT/prof.log"
