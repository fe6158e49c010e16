#!/usr/bin/env bash
# Issue 35, session 17 (< 3 min): bench_control_plane's CUDA TP-1 rows alternated with the tree
# at cd2b7d2 (./before.tar: `git archive -o before.tar cd2b7d2`), then the step profile.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
bash scripts/gpu_35_vs_before.sh 3 > "$OUT/d_bench.log" 2>&1
DEVICE=cuda OUT=$OUT timeout 40 bash scripts/gpu_35_prof.sh > /dev/null 2>&1
cat "$OUT/d_bench.log"
