#!/usr/bin/env bash
# Issue 35's GPU checks after a kernel or pool change (< 5 min): the engine step under
# set_sync_debug_mode("error") and the sync census, then the GPU tests of the scheduler's path
# (devices, kernels, pools, controller, radix, engine). Logs $OUT/nosync.log and $OUT/tests.log.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
P="python3 -m pytest -q -o addopts= -rfE -p no:cacheprovider"
{
  PYTHONPATH=$PWD timeout 60 $P tests/engine/test_engine_nosync_gpu.py 2>&1 | tail -2
  PYTHONPATH=$PWD timeout 60 python3 benchmarks/probes/sync_census.py 2>&1 | tail -4
} > "$OUT/nosync.log" 2>&1
PYTHONPATH=$PWD timeout 250 $P -m "not slow and not mooncake" \
  tests/test_devices.py tests/kernels tests/pools tests/controller tests/radix tests/engine \
  > "$OUT/tests.log" 2>&1
