#!/usr/bin/env bash
# Issue 35, part nosync, on one GPU (< 4 min): the scheduler steps under
# set_sync_debug_mode("error") (must pass: no sync left), the census of the
# syncs still there, and bench_control_plane's CUDA TP-1 row. Two files under $OUT.
set -euo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
{
  timeout 90 python3 -m pytest -q -o addopts="" -rxXfE -p no:cacheprovider \
    tests/engine/test_engine_nosync_gpu.py 2>&1 | tail -4 || true
  echo "== sync census"
  timeout 60 python3 benchmarks/probes/sync_census.py || true
} > "$OUT/nosync_syncs.log" 2>&1
timeout 80 python3 benchmarks/bench_control_plane.py --device cuda --tp 1 --steps 100 \
  > "$OUT/nosync_control_plane.log" 2>&1
cat "$OUT/nosync_syncs.log"
cat "$OUT/nosync_control_plane.log"
