#!/usr/bin/env bash
# Issue 35, part pfast, on one GPU (< 4 min): the prefill path's changes (the host tier's
# trusted writes and loads, the engine's fused finish, devices' fast paths) under
# set_sync_debug_mode("error") and the sync census (must stay at the model's one site), the
# controller's CUDA round trips (trusted calls included), pfast3's kernels/pools/devices tests
# on CUDA, and bench_control_plane's CUDA TP-1 rows. Two files under $OUT; the bench table last.
set -euo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
{
  timeout 90 python3 -m pytest -q -o addopts="" -rxXfE -p no:cacheprovider \
    tests/engine/test_engine_nosync_gpu.py 2>&1 | tail -4 || true
  echo "== sync census"
  timeout 60 python3 benchmarks/probes/sync_census.py || true
  echo "== controller on CUDA"
  timeout 60 python3 -m pytest -q -o addopts="" -p no:cacheprovider -x \
    tests/controller/test_controller_gpu.py tests/controller/test_controller_transfers.py \
    tests/engine/test_engine_cache_calls.py 2>&1 | tail -3 || true
  echo "== pfast3: plans checking only their indices, free-list runs, stream scopes, host order"
  timeout 60 python3 -m pytest -q -o addopts="" -p no:cacheprovider -x \
    tests/kernels/test_layer_plan.py tests/kernels/test_layer_plan_checks.py \
    tests/pools/test_allocator.py tests/pools/test_load_plan.py tests/test_devices.py \
    tests/controller/test_host_order.py 2>&1 | tail -3 || true
} > "$OUT/pfast_checks.log" 2>&1
timeout 80 python3 benchmarks/bench_control_plane.py --device cuda --tp 1 --steps 100 \
  > "$OUT/pfast_control_plane.log" 2>&1
cat "$OUT/pfast_checks.log"
cat "$OUT/pfast_control_plane.log"
