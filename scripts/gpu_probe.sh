#!/usr/bin/env bash
# Probe of the CPU cost of a load batch on the H200: launch pieces, cProfile of bench_issue, and
# the forward pass's CPU time in bench_overlap's host and device hits. Logs under $OUT.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
timeout 100 python3 benchmarks/probes/launch_cost.py 2>&1 | tee "$OUT/launch.log"
timeout 200 python3 benchmarks/bench_issue.py --tokens 8192 --pages 64 --backends kernel,direct \
  --repeats 5 --profile "${PROFILE:-10}" > "$OUT/issue.log" 2>&1; tail -6 "$OUT/issue.log"
timeout "${OVERLAP_TIMEOUT:-200}" python3 benchmarks/bench_overlap.py --backends auto --pages 64 \
  --layers-ahead 2,all --pairs "${PAIRS:-8k/256,32k/512}" --repeats "${REPEATS:-5}" \
  --json "$OUT/overlap.json" 2>&1 | tee "$OUT/overlap.log" | tail -8
