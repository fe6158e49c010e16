#!/usr/bin/env bash
# One device call for the pool family and the tier layout: the GPU tests (GPU_TESTS), the
# move_kv_cache and FP4 benchmarks, then bench_transfer's h2d section at HEAD and, when BASE_DIR
# holds an older tree (hicache/ + benchmarks/), at that tree in the same call. Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
ROOT=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
TESTS=${GPU_TESTS:-tests/kernels tests/pools tests/controller tests/engine}
PYTHONPATH=$ROOT timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -o addopts="" -rfE \
  -p no:cacheprovider -m "not slow and not mooncake" $TESTS 2>&1 | tee "$OUT/gpu_tests.log" | tail -12
cd "$ROOT/benchmarks"
PYTHONPATH=$ROOT timeout 120 python3 bench_move_kv.py 2>&1 | tee "$OUT/move_kv.log" | tail -16
PYTHONPATH=$ROOT timeout 90 python3 bench_fp4.py --json "$OUT/fp4.json" 2>&1 | tee "$OUT/fp4.log" | tail -14
TRANSFER_ARGS=${TRANSFER_ARGS:---sections h2d --items 2K --budget-s 40}
for tree in ${BASE_DIR:+"$ROOT/$BASE_DIR"} "$ROOT"; do
  name=$([ "$tree" = "$ROOT" ] && echo head || echo base)
  (cd "$tree" && PYTHONPATH=$tree timeout 120 python3 benchmarks/bench_transfer.py \
    --json "$OUT/transfer_$name.json" $TRANSFER_ARGS > "$OUT/transfer_$name.log" 2>&1)
  echo "== bench_transfer at $name"; tail -14 "$OUT/transfer_$name.log"
done
