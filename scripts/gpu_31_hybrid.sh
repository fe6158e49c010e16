#!/usr/bin/env bash
# Issue 31 (first brick) on a GPU box: the hybrid TinyTransformer's equal-logits tests on CUDA
# (patterns F, S, L, FSL, FSLFSL; MHA and MLA; pages 1 and 16: one prefill = chunked prefill =
# decode, and a restored state checkpoint + the window's KV = cold), then the same on the CPU.
# One log under $OUT; a short table last.
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
export PYTHONPATH=$PWD
log=$OUT/gpu_31_hybrid.log
: > "$log"
summary() {  # $1: device, $2: pytest -k expression
  local line
  line=$(timeout 100 python3 -m pytest -q -o addopts="" -rfE -p no:cacheprovider \
    tests/model/test_hybrid.py -k "$2" 2>&1 | tee -a "$log" | tail -1) || true
  printf '%-5s %s\n' "$1" "$line"
}
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" \
  | tee -a "$log"
rows=$(summary cuda cuda; summary cpu cpu)
echo "== hybrid model equal-logits tests (tests/model/test_hybrid.py) =="
echo "$rows"
