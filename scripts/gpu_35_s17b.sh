#!/usr/bin/env bash
# Issue 35, session 17 (< 5 min): the load-back path's cuts (scripts/gpu_35_load4.sh: no-sync
# step, census, controller/host-tier CUDA tests), the kernel launch kept across batches
# (tests/kernels on CUDA), then bench_control_plane's CUDA TP-1 rows alternated with the tree
# at cd2b7d2 (./before.tar, made by `git archive -o before.tar cd2b7d2`), and the step profile.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
OUT=$OUT timeout 200 bash scripts/gpu_35_load4.sh > /dev/null 2>&1
PYTHONPATH=$PWD timeout 150 python3 -m pytest -q -o addopts="" -rfE -p no:cacheprovider \
  tests/kernels/test_launch_reuse.py tests/kernels/test_layer_plan.py tests/kernels/test_cuda.py \
  tests/kernels/test_ops_triton.py tests/pools > "$OUT/s17b_kernels.log" 2>&1
if [ -f before.tar ]; then
  mkdir -p /tmp/before && tar -xf before.tar -C /tmp/before
  (cd /tmp/before && python3 setup.py -q build_ext --inplace > /dev/null 2>&1)
  for i in 1 2; do
    for tree in /tmp/before "$PWD"; do
      echo "--- $tree" >> "$OUT/s17b_bench.log"
      (cd "$tree" && PYTHONPATH=$tree timeout 60 python3 benchmarks/bench_control_plane.py \
        --device cuda --tp 1 --steps 100 2>&1 | grep "^  1 ") >> "$OUT/s17b_bench.log"
    done
  done
fi
DEVICE=cuda OUT=$OUT PYTHONPATH=$PWD timeout 60 bash scripts/gpu_35_prof.sh > /dev/null 2>&1
echo "=== load4 checks"; cat "$OUT/load4_checks.log"
echo "=== kernels: $(tail -1 "$OUT/s17b_kernels.log")"
echo "=== bench (before = cd2b7d2)"; cat "$OUT/s17b_bench.log"
echo "=== profile"; head -45 "$OUT/prof.log"
