#!/usr/bin/env bash
# Issue 35, session 17, one GPU call (< 8 min): the no-sync step and census, the GPU tests of
# everything this round changed (kernels: launch kept across batches; uploads: the pinned ring;
# pools, controller, radix, engine: the load4 and fin4 cuts), bench_control_plane's CUDA TP-1
# rows alternated with the tree at cd2b7d2 (./before.tar: `git archive -o before.tar cd2b7d2`),
# and the step profile. Logs under $OUT, a summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
OUT=$OUT bash scripts/gpu_35_suite.sh
[ -f before.tar ] && bash scripts/gpu_35_vs_before.sh 2 > "$OUT/c_bench.log" 2>&1
DEVICE=cuda OUT=$OUT timeout 40 bash scripts/gpu_35_prof.sh > /dev/null 2>&1
echo "=== no sync"; cat "$OUT/nosync.log"
echo "=== tests"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests.log" | tail -15
echo "=== bench (before = cd2b7d2)"; cat "$OUT/c_bench.log"
echo "=== profile"; head -42 "$OUT/prof.log"
