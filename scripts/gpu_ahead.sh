#!/usr/bin/env bash
# layers_ahead on the H200: the GPU tests of the deferred layer issue, then bench_overlap with
# each load batch issued whole against its later layers issued by the forward pass.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
timeout "${TEST_TIMEOUT:-120}" python3 -m pytest -q -o addopts="" -rfE -p no:cacheprovider \
  tests/controller/test_controller_gpu.py tests/controller/test_layers_ahead.py \
  "tests/engine/test_engine_hiradix.py::test_bf16_cuda_matches_reference_within_bf16_noise" \
  2>&1 | tee "$OUT/tests.log" | tail -8
timeout "${OVERLAP_TIMEOUT:-420}" python3 benchmarks/bench_overlap.py \
  --backends "${BACKENDS:-auto,direct,kernel}" --pages "${PAGES:-64}" --layers-ahead all,2 \
  --repeats "${REPEATS:-3}" --json "$OUT/bench_overlap.json" 2>&1 | tee "$OUT/overlap.log" | tail -40
