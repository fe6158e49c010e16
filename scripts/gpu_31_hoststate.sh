#!/usr/bin/env bash
# Issue 31, MambaPoolHost on a GPU box: the host state pool's tests with their CUDA cases (round
# trips from pinned and pageable memory, ordering on a side stream), then backup / load of 8
# Qwen3-Next-sized states (24 layers, ~51 MB each) timed against one contiguous copy of the
# same bytes. Two files under $OUT (the log, the benchmark JSON); the tables last.
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
export PYTHONPATH=$PWD
log=$OUT/gpu_31_hoststate.log
: > "$log"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" \
  | tee -a "$log"
tests=$(timeout 120 python3 -m pytest -q -o addopts="" -rfEs -p no:cacheprovider \
  tests/pools/test_mamba_host_pool.py tests/pools/test_mamba_host_pool_misuse.py 2>&1 \
  | tee -a "$log" | tail -1) || true
table=$(timeout 90 python3 benchmarks/bench_mamba_host.py --device cuda \
  --json "$OUT/gpu_31_hoststate.json" 2>&1 | tee -a "$log" | tail -7) || true
echo "== MambaPoolHost tests (CPU + CUDA cases) =="
echo "$tests"
echo "== MambaPoolHost transfers vs one contiguous copy =="
echo "$table"
