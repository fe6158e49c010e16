#!/usr/bin/env bash
# Issue 31: the hybrid stress route on CUDA (< 5 min): FSL and FL (decode tracking at page 16)
# over every route, with faults, pools on the GPU. One file under $OUT; the totals last.
set -euo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
for p in FSL FL; do
  timeout 130 python3 -m hicache.stress --ops 400 --faults 0.02 --device cuda --no-progress \
    --layers-pattern $p --page-sizes 1 16 --max-seconds 110 >> "$OUT/hystress.log" 2>&1 \
    || echo "$p: exit $?" >> "$OUT/hystress.log"
done
tail -60 "$OUT/hystress.log"
