#!/usr/bin/env bash
# Issue 35: the TP agreement through shared memory on the device machine (16 idle cores).
# 1. bench_control_plane.py with CPU ranks, TP 1,2,4, the gloo channel then shared memory;
# 2. the shared-memory tests and the CUDA TP tests (two ranks sharing the GPU agree through it);
# 3. `hicache bench --tp 2 --device cuda` on a short config. Under 9 minutes.
# 0. benchmarks/probes/agree_latency.py: one agreement's cost through each channel;
# Writes $OUT/shm_probe.log, $OUT/shm_bench.log and $OUT/shm_tests.log; the tables last.
set -euo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
echo "cores: $(nproc)"
timeout 120 python3 benchmarks/probes/agree_latency.py --tp 2,4,8 --calls 5000 \
  > "$OUT/shm_probe.log" 2>&1 || echo "probe failed: rc $?" >> "$OUT/shm_probe.log"
for t in group auto; do
  echo "--- transport $t" >> "$OUT/shm_bench.log"
  timeout 200 python3 benchmarks/bench_control_plane.py --device cpu --tp 1,2,4 --steps 150 \
    --transport "$t" >> "$OUT/shm_bench.log" 2>&1 || echo "bench ($t) failed: rc $?" | tee -a "$OUT/shm_bench.log"
done
timeout 150 python3 -m pytest -q -o addopts="" -rfEs -p no:cacheprovider \
  tests/tp/test_shm.py tests/tp/test_tp_cuda.py 2>&1 | tee "$OUT/shm_tests.log" | tail -5 || true
timeout 90 python3 -m hicache bench --tp 2 --device cuda --no-progress --out-dir "$(mktemp -d)" \
  --users 4 --rounds 3 --system-len 256 --prompt-len 128 --answer-len 4 --layers 4 \
  --device-tokens 1024 --max-prefill-tokens 512 2>&1 | grep -E "^TP:|hit rate|TTFT" | head -6 || true
echo
echo "=== gpu_35_shm ==="
cat "$OUT/shm_probe.log"
cat "$OUT/shm_bench.log"
echo "tests: $(tail -1 "$OUT/shm_tests.log")"
