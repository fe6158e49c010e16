#!/usr/bin/env bash
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p $OUT
L=$OUT/run2.log
timeout 60 python3 -m pytest -q -x -rfE -p no:cacheprovider tests/pools/test_host_transfer.py -k "cuda and (auto or pinned or gc)" > $OUT/tests.log 2>&1; echo "tests A rc=$?" | tee -a $L; tail -4 $OUT/tests.log
timeout 60 python3 -m pytest -q -x -rfE -p no:cacheprovider tests/pools/test_host_memory.py tests/stress/test_memory_safety.py tests/controller/test_controller_gpu.py >> $OUT/tests.log 2>&1; echo "tests B rc=$?" | tee -a $L; tail -4 $OUT/tests.log
timeout 40 python3 -c "import sys; from hicache.selfcheck import main; sys.exit(main(sys.argv[1:]))" --tokens 16384 --layers 4 >> $OUT/tests.log 2>&1; echo "selfcheck rc=$?" | tee -a $L; tail -13 $OUT/tests.log
for a in plain touch huge; do
  timeout 35 python3 benchmarks/bench_transfer.py --sections h2d --items 2K --tokens 16K --page-sizes 1 --ops per_layer,per_layer_pf_lf --arena $a --budget-s 25 --json $OUT/diag_$a.json > $OUT/d.log 2>&1; echo "diag $a rc=$?" | tee -a $L; grep -E "^load|^copy H2D" $OUT/d.log | tee -a $L
done
timeout 60 python3 benchmarks/bench_transfer.py --sections h2d --ops "per_layer,direct (layer_first),auto (layer_first),all_layer" --large-pool-factor 0 --budget-s 45 --json $OUT/auto.json > $OUT/d.log 2>&1; echo "auto rc=$?" | tee -a $L; grep -E "^load|^backup|^copy" $OUT/d.log | tee -a $L
timeout 30 python3 benchmarks/bench_host_pool.py --sizes-gib 64 --methods chunks_4k --large-methods chunks_4k --json $OUT/host_pool64.json > $OUT/d.log 2>&1; echo "hp rc=$?" | tee -a $L; tail -4 $OUT/d.log | tee -a $L
