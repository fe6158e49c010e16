#!/usr/bin/env bash
# Issue 31, part hostkv, on a GPU box: a composite device pool's KV (SWAKVPool, MHA and MLA,
# SWA pool smaller than full; HybridLinearKVPool) through HiCacheController and a
# HybridKVPoolHost on CUDA: round trips on every route, tombstoned SWA tokens (pad slot 0
# only), per-layer readiness on global layers with layers_ahead=1; then the plain controller
# tests (no behaviour change). One log under $OUT; a short table last.
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
export PYTHONPATH=$PWD
log=$OUT/gpu_31_hostkv.log
: > "$log"
run() {  # $1: label, $2: pytest -k expression, rest: test paths
  local label=$1 expr=$2 line; shift 2
  line=$(timeout 100 python3 -m pytest -q -o addopts="" -rfE -p no:cacheprovider "$@" \
    -k "$expr" 2>&1 | tee -a "$log" | tail -1) || true
  printf '%-22s %s\n' "$label" "$line"
}
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" \
  | tee -a "$log"
rows=$(
  run "hybrid host, cuda" cuda tests/controller/test_hybrid_host.py
  run "hybrid host, cpu" "not cuda" tests/controller/test_hybrid_host.py \
    tests/pools/test_hybrid_host_pool.py
  run "plain controller" "" tests/controller/test_controller_transfers.py \
    tests/controller/test_layers_ahead.py tests/controller/test_controller_gpu.py
)
echo "== issue 31 hostkv: HybridKVPoolHost through HiCacheController =="
echo "$rows"
