#!/usr/bin/env bash
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p $OUT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag; ulimit -l; free -g; nproc; git log --oneline -1 2>/dev/null; } 2>&1 | tee $OUT/env.log
timeout 110 python3 benchmarks/bench_host_pool.py --sizes-gib 16,64,128 --methods register,touch,thp,chunks,chunks_4k,alloc,pool --large-methods register,chunks --json $OUT/host_pool.json > $OUT/host_pool.log 2>&1; echo "host_pool rc=$?"
timeout 60 python3 benchmarks/bench_host_pool.py --sizes-gib 100 --methods chunks --json $OUT/host_pool_max.json > $OUT/host_pool_max.log 2>&1; echo "host_pool_max rc=$?"
timeout 90 python3 benchmarks/bench_transfer.py --sections h2d --budget-s 75 --json $OUT/h2d.json > $OUT/h2d.log 2>&1; echo "h2d rc=$?"
for arena in huge plain; do for order in sorted random; do
  timeout 40 python3 benchmarks/bench_transfer.py --sections h2d --items 2K --page-sizes 1 --ops per_layer,per_layer_pf_lf --arena $arena --order $order --budget-s 30 --json $OUT/diag_${arena}_${order}.json > $OUT/diag_${arena}_${order}.log 2>&1; echo "diag $arena $order rc=$?"
done; done
tail -22 $OUT/host_pool.log; tail -4 $OUT/host_pool_max.log
for f in $OUT/diag_*.log; do echo "== $f"; grep -E "^load|^copy" $f; done
tail -45 $OUT/h2d.log
