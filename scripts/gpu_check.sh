#!/usr/bin/env bash
# One device-machine call: GPU test suite, self-check, and (when their *_ARGS are set) the
# transfer benchmark, the stress harness and the main job. Logs under $OUT.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
if ! command -v nvidia-smi >/dev/null 2>&1 || ! python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  echo "gpu_check.sh: no CUDA device here (nvidia-smi missing or torch.cuda.is_available() is False); on a CPU machine run: bash scripts/test.sh" >&2
  exit 2
fi
OUT=${OUT:-results}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
TESTS=${GPU_TESTS:-tests}
timeout "${TEST_TIMEOUT:-540}" python3 -m pytest -rfE -p no:cacheprovider $TESTS 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
python3 -c "import sys; from hicache.selfcheck import main; sys.exit(main(sys.argv[1:]))" --tokens 65536 --layers 8 2>&1 | tee "$OUT/selfcheck.log"
if [ -n "${STRESS_ARGS+x}" ]; then
  timeout "${STRESS_TIMEOUT:-120}" python3 -m hicache.stress --device cuda $STRESS_ARGS 2>&1 | tee "$OUT/stress.log" | tail -8
fi
if [ -n "${MAIN_ARGS+x}" ]; then
  timeout "${MAIN_TIMEOUT:-200}" python3 -m hicache bench --no-progress --out-dir "$OUT/bench" $MAIN_ARGS 2>&1 | tee "$OUT/main.log" | tail -30
fi
if [ -n "${BENCH_ARGS+x}" ]; then
  timeout "${BENCH_TIMEOUT:-260}" python3 benchmarks/bench_transfer.py --json "$OUT/bench_transfer.json" $BENCH_ARGS 2>&1 | tee "$OUT/bench.log" | tail -60
fi
