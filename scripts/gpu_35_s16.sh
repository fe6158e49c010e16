#!/usr/bin/env bash
# Issue 35, session 16, one GPU call (< 9 min; each part writes its own log under $OUT, so a
# cut-short run still returns the parts done): pfast3's CUDA checks and the CUDA TP-1 rows
# (scripts/gpu_35_pfast.sh), the CUDA TP tests (ranks sharing the GPU agree through shared
# memory), then the shared-memory agreement on the machine's idle cores (probe;
# bench_control_plane CPU ranks through shared memory and, for the ratio, through gloo).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
echo "cores: $(nproc)"
timeout 200 bash scripts/gpu_35_pfast.sh > "$OUT/s16_pfast.log" 2>&1
timeout 100 python3 -m pytest -q -o addopts="" -rfE -p no:cacheprovider \
  tests/tp/test_shm.py tests/tp/test_tp_cuda.py > "$OUT/s16_tp_tests.log" 2>&1
timeout 60 python3 benchmarks/probes/agree_latency.py --tp 2,4,8 --calls 3000 > "$OUT/s16_probe.log" 2>&1
echo "--- transport auto" > "$OUT/s16_cplane.log"
timeout 100 python3 benchmarks/bench_control_plane.py --device cpu --tp 1,2,4 --steps 100 \
  >> "$OUT/s16_cplane.log" 2>&1
echo "--- transport group" >> "$OUT/s16_cplane.log"
timeout 60 python3 benchmarks/bench_control_plane.py --device cpu --tp 2,4 --steps 100 \
  --transport group >> "$OUT/s16_cplane.log" 2>&1
echo "=== pfast"; cat "$OUT/s16_pfast.log"
echo "=== tp tests: $(tail -1 "$OUT/s16_tp_tests.log")"
echo "=== probe"; cat "$OUT/s16_probe.log"
echo "=== control plane, CPU ranks"; cat "$OUT/s16_cplane.log"
