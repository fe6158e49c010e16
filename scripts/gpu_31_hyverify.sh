#!/usr/bin/env bash
# Issue 31, part hyverify, on a GPU box: page integrity (verify="all") of a hybrid host tier on
# CUDA: the checksum kernel into a strided store block with skip_pad (pad slot 0), a composite
# pool's round trips, flipped host bytes (full and SWA layers), tombstoned pages; then the
# plain checksum kernel tests (no behaviour change). One log under $OUT; a short table last.
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
export PYTHONPATH=$PWD
log=$OUT/gpu_31_hyverify.log
: > "$log"
run() {  # $1: label, $2: pytest -k expression, rest: test paths
  local label=$1 expr=$2 line; shift 2
  line=$(timeout 100 python3 -m pytest -q -o addopts="" -rfE -p no:cacheprovider "$@" \
    -k "$expr" 2>&1 | tee -a "$log" | tail -1) || true
  printf '%-24s %s\n' "$label" "$line"
}
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" \
  | tee -a "$log"
rows=$(
  run "checksum pad, cuda" cuda tests/kernels/test_checksum_pad.py
  run "hybrid verify, cuda" cuda tests/controller/test_hybrid_integrity.py
  run "checksum kernel, cuda" "cuda" tests/kernels/test_checksum.py
  run "plain verify (cpu+gpu)" "" tests/radix/test_storage_integrity.py \
    tests/radix/test_misuse_integrity.py
)
echo "== issue 31 hyverify: page integrity of a hybrid host tier =="
echo "$rows"
