#!/usr/bin/env bash
# bench_control_plane's CUDA TP-1 rows of this tree alternated with an earlier one, on one GPU
# machine: ./before.tar (`git archive -o before.tar <commit>`), unpacked and built in /tmp/before.
# Usage: OUT=dir bash scripts/gpu_35_vs_before.sh [pairs] > log   (rows of each tree in turn)
set -uo pipefail
export PYTHONUNBUFFERED=1
[ -f before.tar ] || { echo "no before.tar here" >&2; exit 2; }
mkdir -p /tmp/before && tar -xf before.tar -C /tmp/before
(cd /tmp/before && python3 setup.py -q build_ext --inplace > /dev/null 2>&1)
for _ in $(seq "${1:-2}"); do
  for tree in /tmp/before "$PWD"; do
    echo "--- $tree"
    (cd "$tree" && PYTHONPATH=$tree timeout 40 python3 benchmarks/bench_control_plane.py \
      --device cuda --tp 1 --steps 100 2>&1 | grep "^  1 ")
  done
done
