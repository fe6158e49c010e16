#!/usr/bin/env bash
# Staged kernel backups on the H200: the GPU tests of the transfer paths and the staged-backup
# probe (stage A); bench_overlap's kernel backend with staging off and on (stage B, PAIRS and
# PAGES to narrow it). Logs under $OUT.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
if [ "${STAGE:-A}" = A ]; then
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -o addopts="" -rfE -p no:cacheprovider \
    tests/pools tests/controller tests/kernels/test_layer_plan.py \
    "tests/engine/test_engine_hiradix.py::test_bf16_cuda_matches_reference_within_bf16_noise" \
    2>&1 | tee "$OUT/tests.log" | tail -6
  timeout 150 python3 benchmarks/probes/staged_backup.py --quotas "${QUOTAS:-8,16,32}" \
    2>&1 | tee "$OUT/staged.log" | tail -9
else
  for mb in 0 256; do
    HICACHE_BACKUP_STAGING_MB=$mb timeout "${OVERLAP_TIMEOUT:-280}" python3 \
      benchmarks/bench_overlap.py --backends kernel --pages "${PAGES:-1,64}" \
      --pairs "${PAIRS:-16k/1k,32k/512}" --repeats "${REPEATS:-3}" \
      --json "$OUT/bench_overlap_staging$mb.json" > "$OUT/overlap$mb.log" 2>&1
    echo "== HICACHE_BACKUP_STAGING_MB=$mb"; tail -8 "$OUT/overlap$mb.log"
  done
fi
