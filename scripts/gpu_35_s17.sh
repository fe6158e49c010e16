#!/usr/bin/env bash
# Issue 35, session 17, one GPU call (< 10 min): where the CUDA prefill step with a host hit
# spends its CPU (cProfile, benchmarks/probes/step_profile.py), then session 16's checks
# (scripts/gpu_35_s16.sh: pfast3's CUDA checks and TP-1 rows, the CUDA TP tests, the
# shared-memory agreement on the machine's idle cores). Each part logs under $OUT.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
timeout 90 python3 benchmarks/probes/step_profile.py --device cuda --steps 100 --rows 40 \
  > "$OUT/s17_profile.log" 2>&1
OUT=$OUT bash scripts/gpu_35_s16.sh
echo "=== profile"; cat "$OUT/s17_profile.log"
