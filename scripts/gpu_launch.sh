#!/usr/bin/env bash
# The launch-path changes on the H200: their GPU tests, the launch-cost probe, bench_issue
# (ISSUE_PROFILE=N: with cProfile of N batches) and the forward-interference probe (stage A);
# bench_overlap (stage B; PROFILE=1: with cProfile of the last round's hits). Logs under $OUT.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
if [ "${STAGE:-A}" = A ]; then
  timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -o addopts="" -rfE -p no:cacheprovider \
    tests/test_devices.py tests/kernels/test_layer_plan.py tests/controller/test_controller_gpu.py \
    tests/controller/test_layers_ahead.py tests/pools/test_load_planners.py \
    tests/pools/test_load_plan.py tests/pools/test_host_transfer.py \
    "tests/engine/test_engine_hiradix.py::test_bf16_cuda_matches_reference_within_bf16_noise" \
    2>&1 | tee "$OUT/tests.log" | tail -6
  timeout 100 python3 benchmarks/probes/launch_cost.py 2>&1 | tee "$OUT/launch.log"
  timeout 120 python3 benchmarks/bench_issue.py --tokens 1024,8192 --pages 64 --repeats 5 \
    --profile "${ISSUE_PROFILE:-0}" 2>&1 | tee "$OUT/issue.log" | tail -7
  timeout 150 python3 benchmarks/probes/forward_interference.py --pairs 8k/256,32k/512 \
    2>&1 | tee "$OUT/interference.log" | tail -4
else
  timeout "${OVERLAP_TIMEOUT:-500}" python3 benchmarks/bench_overlap.py --backends auto,direct \
    --pages 64 --layers-ahead all,2 --repeats "${REPEATS:-3}" ${PROFILE:+--profile} \
    --json "$OUT/bench_overlap.json" > "$OUT/overlap.log" 2>&1; tail -20 "$OUT/overlap.log"
fi
