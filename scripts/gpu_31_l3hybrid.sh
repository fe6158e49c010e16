#!/usr/bin/env bash
# Issue 31, part l3hybrid, on a GPU box: storage warm restart of a hybrid model on CUDA (engine A
# serves a first turn and drains it to a file store; a new engine B serves the second turn from
# storage: KV pages of every attention layer and the recurrent state), logits equal to the same
# request computed cold, for FSL/FSLFSL/FS x MHA/MLA x pages 1/16; then the CPU tree-level
# storage tests of hybrid components. One log under $OUT; a short table last (well under 4 min).
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
export PYTHONPATH=$PWD
log=$OUT/gpu_31_l3hybrid.log
: > "$log"
run() {  # $1: label, $2: pytest -k expression, rest: test paths
  local label=$1 expr=$2 line; shift 2
  line=$(timeout 150 python3 -m pytest -q -o addopts="" -rfE -p no:cacheprovider "$@" \
    -k "$expr" 2>&1 | tee -a "$log" | tail -1) || true
  printf '%-26s %s\n' "$label" "$line"
}
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" \
  | tee -a "$log"
rows=$(
  run "warm restart, cuda" cuda tests/engine/test_engine_hybrid_storage.py
  run "warm restart, cpu" "not cuda" tests/engine/test_engine_hybrid_storage.py
  run "tree-level storage, cpu" "" tests/radix/test_hybrid_storage.py
)
echo "== issue 31 l3hybrid: a hybrid model through the storage tier =="
echo "$rows"
