#!/usr/bin/env bash
# Issue 34's figures: inclusive vs exclusive tiering per tier across a capacity sweep, on a
# public Mooncake trace and on the generator's long-prompt trace, with and without a storage
# tier. Usage: bash scripts/replay_34.sh MOONCAKE_TRACE OUT_DIR (the Mooncake trace:
# FAST25-release/traces/conversation_trace.jsonl of github.com/kvcache-ai/Mooncake).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
trace=$1
out=$2
py=${PYTHON:-python}
mkdir -p "$out"
$py -m hicache replay --generate "$out/long.jsonl" --preset long-prompt --generate-only
run() {  # name trace sweep [flags]
  local name=$1 t=$2 sweep=$3
  shift 3
  $py -m hicache replay "$t" --no-progress --out-dir "$out/$name" --sweep "$sweep" "$@" \
    | tee "$out/$name.txt"
}
tier=tiering=inclusive,exclusive
both=storage-tiering=inclusive,exclusive
run mc_host "$trace" "device-tokens=524288,1048576,2097152,host-ratio=0.5,2,$tier"
run mc_storage "$trace" "host-ratio=0.5,2,storage-capacity=4194304,$tier,$both" \
  --device-tokens 1048576 --storage memory
run long_host "$out/long.jsonl" "device-tokens=524288,2097152,host-ratio=0.5,2,$tier"
run long_storage "$out/long.jsonl" "host-ratio=2,storage-capacity=8388608,$tier,$both" \
  --device-tokens 1048576 --storage memory --page-size 64  # 144M prompt tokens: pages of 64
