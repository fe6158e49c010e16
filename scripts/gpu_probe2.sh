export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 100 python3 benchmarks/probes/launch_cost.py 2>&1 | tee $OUT/launch.log
timeout 250 python3 benchmarks/bench_overlap.py --backends auto --pages 64 --layers-ahead all,2 --pairs 8k/256 --repeats 3 --profile --json $OUT/overlap.json > $OUT/overlap.log 2>&1; tail -6 $OUT/overlap.log
