#!/usr/bin/env bash
# Issue 35, part load4, on one GPU (< 4 min): the load-back path's cuts on CUDA (a ring slot
# renewed with CUDA events and waited for through update_producer's callback, the host tier's
# load reading the allocator's carried CPU copy, the idle step's skip) under
# set_sync_debug_mode("error") and the sync census, the controller's and the host tier's CUDA
# round trips, and bench_control_plane's CUDA TP-1 rows. Two files under $OUT; the bench last.
set -euo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
{
  echo "== the scheduler step on CUDA, no sync"
  timeout 90 python3 -m pytest -q -o addopts="" -rxXfE -p no:cacheprovider \
    tests/engine/test_engine_nosync_gpu.py 2>&1 | tail -4 || true
  echo "== sync census"
  timeout 60 python3 benchmarks/probes/sync_census.py || true
  echo "== controller, layer-done ring and host tier on CUDA"
  timeout 90 python3 -m pytest -q -o addopts="" -p no:cacheprovider -x \
    tests/controller/test_controller_gpu.py tests/controller/test_layer_done.py \
    tests/controller/test_layers_ahead.py tests/radix/test_hiradix_roundtrip.py \
    tests/radix/test_host_idle_step.py tests/pools/test_allocator.py \
    tests/engine/test_engine_cache_calls.py 2>&1 | tail -3 || true
} > "$OUT/load4_checks.log" 2>&1
timeout 80 python3 benchmarks/bench_control_plane.py --device cuda --tp 1 --steps 100 \
  > "$OUT/load4_control_plane.log" 2>&1
cat "$OUT/load4_checks.log"
cat "$OUT/load4_control_plane.log"
