#!/usr/bin/env bash
# Issue 35, TP ranks on CUDA: the CUDA TP tests (two ranks on one GPU share it: gloo for every
# collective; on 2+ GPUs each rank has its own and the model runs on NCCL), then
# `hicache bench --tp 2 --device cuda` on a short config. Under 3 minutes.
# Writes $OUT/tp_cuda_tests.log and $OUT/tp_cuda_bench.log.
set -euo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" \
  || { echo "gpu_35_tpcuda.sh: no CUDA device here" >&2; exit 2; }
python3 -c "import torch, torch.distributed as d; print('torch', torch.__version__, \
'gpus', torch.cuda.device_count(), 'nccl', d.is_nccl_available() and torch.cuda.nccl.version())"
status=0
timeout 120 python3 -m pytest -q -o addopts="" -rfEs -p no:cacheprovider \
  tests/tp/test_tp_cuda.py tests/tp/test_placement.py 2>&1 | tee "$OUT/tp_cuda_tests.log" | tail -12 \
  || status=1
timeout 90 python3 -m hicache bench --tp 2 --device cuda --no-progress --out-dir "$(mktemp -d)" \
  --users 4 --rounds 3 --system-len 256 --prompt-len 128 --answer-len 4 --layers 4 \
  --device-tokens 1024 --max-prefill-tokens 512 2>&1 | tee "$OUT/tp_cuda_bench.log" | tail -16 \
  || status=1
echo
echo "=== gpu_35_tpcuda summary ==="
printf '%-28s %s\n' "tests (tests/tp cuda+cpu)" "$(tail -1 "$OUT/tp_cuda_tests.log")"
printf '%-28s %s\n' "bench --tp 2 --device cuda" "$(grep -m1 '^TP:' "$OUT/tp_cuda_bench.log" || echo FAILED)"
exit $status
