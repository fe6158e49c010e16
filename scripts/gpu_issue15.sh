#!/usr/bin/env bash
# Issue 15's H200 batch: the GPU tests of the transfer path, selfcheck, then bench_overlap (every
# io_backend) and bench_issue at page 64 (with pages 1 and 64 it outlasted a 60 s limit on the
# H200). Logs and JSON under $OUT.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
GPU_TESTS="${GPU_TESTS:-tests/kernels tests/pools tests/controller tests/engine tests/benchmarks}" \
  TEST_TIMEOUT="${TEST_TIMEOUT:-200}" bash scripts/gpu_check.sh
timeout "${OVERLAP_TIMEOUT:-200}" python3 benchmarks/bench_overlap.py --backends kernel,direct,auto \
  --repeats "${REPEATS:-2}" --json "$OUT/bench_overlap.json" 2>&1 | tee "$OUT/overlap.log" | tail -40
timeout "${ISSUE_TIMEOUT:-120}" python3 benchmarks/bench_issue.py --tokens 1024,8192 --pages 64 2>&1 | tee "$OUT/issue.log" | tail -15
