#!/usr/bin/env bash
# Issue 31, decode tracking on one GPU (< 6 min): the hybrid equal-logits check (a turn ending
# mid-page included, scripts/gpu_31_hyeng.sh), then the host-tier gain of FSLFSL against
# FFFFFF on the default GPU workload at page 64 (`hicache bench --device cuda --page-size 64`).
# Files under $OUT: gpu_31_hyeng.txt, dtrack_<pattern>.txt; the gain table last.
set -euo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
OUT=$OUT bash scripts/gpu_31_hyeng.sh | tail -3
for p in FFFFFF FSLFSL; do
  timeout 200 python3 -m hicache bench --layers-pattern $p --device cuda --page-size 64 \
    --no-progress --out-dir "$OUT/bench_$p" > "$OUT/dtrack_$p.txt" 2>&1 || echo "$p: bench failed"
  grep -E "^host tier vs device-only" "$OUT/dtrack_$p.txt" | sed "s/^/$p /" || true
done
