#!/usr/bin/env bash
# Issue 35: control-plane CPU per step with CPU ranks (TP 1, 2, 4 over loopback gloo) on the
# device machine's 16 idle cores, where the ranks do not share 2 busy cores as on the CI box
# (< 3 min). One file under $OUT; the table last.
set -euo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
nproc
timeout 170 python3 benchmarks/bench_control_plane.py --device cpu --tp 1,2,4 --steps 200 \
  > "$OUT/cplane16.log" 2>&1 || echo "bench_control_plane failed: rc $?"
cat "$OUT/cplane16.log"
