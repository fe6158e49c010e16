#!/usr/bin/env bash
# Issue 35, session 17 (< 3 min): bench_control_plane's CUDA TP-1 rows alternated with the tree
# at cd2b7d2 (./before.tar: `git archive -o before.tar cd2b7d2`), then the step profile.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
mkdir -p /tmp/before && tar -xf before.tar -C /tmp/before
(cd /tmp/before && python3 setup.py -q build_ext --inplace > /dev/null 2>&1)
for i in 1 2 3; do
  for tree in /tmp/before "$PWD"; do
    echo "--- $tree" >> "$OUT/d_bench.log"
    (cd "$tree" && PYTHONPATH=$tree timeout 40 python3 benchmarks/bench_control_plane.py \
      --device cuda --tp 1 --steps 100 2>&1 | grep "^  1 ") >> "$OUT/d_bench.log"
  done
done
DEVICE=cuda OUT=$OUT timeout 40 bash scripts/gpu_35_prof.sh > /dev/null 2>&1
cat "$OUT/d_bench.log"
