#!/usr/bin/env bash
# Issue 35, session 17, one GPU call (< 8 min): the no-sync step and census, the GPU tests of
# everything this round changed (kernels: launch kept across batches; uploads: the pinned ring;
# pools, controller, radix, engine: the load4 and fin4 cuts), bench_control_plane's CUDA TP-1
# rows alternated with the tree at cd2b7d2 (./before.tar: `git archive -o before.tar cd2b7d2`),
# and the step profile. Logs under $OUT, a summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
P="python3 -m pytest -q -o addopts= -rfE -p no:cacheprovider"
{
  PYTHONPATH=$PWD timeout 60 $P tests/engine/test_engine_nosync_gpu.py 2>&1 | tail -2
  PYTHONPATH=$PWD timeout 60 python3 benchmarks/probes/sync_census.py 2>&1 | tail -4
} > "$OUT/c_nosync.log" 2>&1
PYTHONPATH=$PWD timeout 250 $P -m "not slow and not mooncake" tests/test_uploads.py \
  tests/test_devices.py tests/kernels tests/pools tests/controller tests/radix tests/engine \
  > "$OUT/c_tests.log" 2>&1
[ -f before.tar ] && bash scripts/gpu_35_vs_before.sh 2 > "$OUT/c_bench.log" 2>&1
DEVICE=cuda OUT=$OUT timeout 40 bash scripts/gpu_35_prof.sh > /dev/null 2>&1
echo "=== no sync"; cat "$OUT/c_nosync.log"
echo "=== tests"; grep -E "passed|failed|FAILED|ERROR" "$OUT/c_tests.log" | tail -15
echo "=== bench (before = cd2b7d2)"; cat "$OUT/c_bench.log"
echo "=== profile"; head -42 "$OUT/prof.log"
