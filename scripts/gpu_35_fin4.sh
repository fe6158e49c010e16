#!/usr/bin/env bash
# Issue 35, part fin4, on one GPU (< 4 min): the finish path's changes on CUDA -- a write batch
# issued inside its stream scope with its own events (issue_write / _backup_batch), the busy
# clock's CUDA spans, the ledger's inline re-filing, the trusted finish freeing its duplicates
# after the insert -- under set_sync_debug_mode("error"), the controller's and the host tier's
# CUDA round trips, and bench_control_plane's CUDA TP-1 rows. Two files under $OUT; the bench
# table last.
set -euo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
{
  echo "== no sync on the scheduler path (finish included)"
  timeout 90 python3 -m pytest -q -o addopts="" -rxXfE -p no:cacheprovider \
    tests/engine/test_engine_nosync_gpu.py 2>&1 | tail -4 || true
  echo "== controller and write batches on CUDA (busy time from stream events, staging)"
  timeout 90 python3 -m pytest -q -o addopts="" -p no:cacheprovider \
    tests/controller/test_controller_gpu.py tests/controller/test_busy_time.py \
    tests/controller/test_write_staging.py tests/controller/test_controller_transfers.py \
    2>&1 | tail -3 || true
  echo "== host tier round trips on CUDA, finish path, call budget"
  timeout 90 python3 -m pytest -q -o addopts="" -p no:cacheprovider \
    tests/radix/test_hiradix_roundtrip.py tests/radix/test_finish_path.py \
    tests/radix/test_trusted_req.py tests/engine/test_finish_calls.py 2>&1 | tail -3 || true
} > "$OUT/fin4_checks.log" 2>&1
timeout 60 python3 benchmarks/bench_control_plane.py --device cuda --tp 1 --steps 100 \
  > "$OUT/fin4_control_plane.log" 2>&1 || true
cat "$OUT/fin4_checks.log"
cat "$OUT/fin4_control_plane.log"
