#!/usr/bin/env bash
# Issue 35, session 18, one GPU call (< 8 min): the no-sync step and census, the GPU tests of
# what this round changed (controller: spans on the batches' own events; kernels: the direct
# runner kept; pools: the request table's one-copy write), bench_control_plane's CUDA TP-1
# rows alternated with the session's start (./before.tar: `git archive -o before.tar 0cdda13`),
# and where the step's CPU goes (benchmarks/probes/nested_us.py). Logs under $OUT, summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
OUT=$OUT bash scripts/gpu_35_suite.sh
[ -f before.tar ] && bash scripts/gpu_35_vs_before.sh 3 > "$OUT/bench.log" 2>&1
PYTHONPATH=$PWD timeout 60 python3 benchmarks/probes/nested_us.py --device cuda --steps 300 \
  hicache.tiers.hiradix_cache:HiRadixCache.cache_finished_req \
  hicache.controller.issue:issue_write hicache.controller.issue:issue_load \
  hicache.pools.host_pool:HostKVPool._prepare hicache.kernels.plans:all_layer \
  hicache.kernels.triton_ops:Launcher.__init__ hicache.kernels.triton_ops:Launcher.run \
  hicache.controller.stats:BusyClock.end hicache.pools.req_to_token:ReqToTokenPool._store \
  hicache.devices:to_device > "$OUT/nested.log" 2>&1
echo "=== no sync"; cat "$OUT/nosync.log"
echo "=== tests"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests.log" | tail -15
echo "=== where the step goes"; cat "$OUT/nested.log"
echo "=== bench (before = 0cdda13)"; cat "$OUT/bench.log"
