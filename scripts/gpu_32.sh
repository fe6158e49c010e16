#!/usr/bin/env bash
# Issue 32 on a GPU box: what integrity costs and how fast the file store reads.
# 1. The storage trailer (xxh3 digest) per object against a copy, on this box's CPU.
# 2. The device page checksum (record at backup, verify at load-back) against a plain copy:
#    bench_verify's kernel table, 16k tokens, page 64.
# 3. File reads at 1 GiB scale against plain readinto, with the default read threads and one.
# 4. The storage and integrity tests on this box. Logs under $OUT; a short table last.
# Needs xxhash: carry .whl (the cp312 wheel) and this installs it.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
if ls .whl/xxhash*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/xxhash*.whl
fi
export PYTHONPATH=$PWD:/tmp/site
# the file store's C reads (hicache.backends.cfile) where a compiler is there
python3 setup.py -q build_ext --inplace >/dev/null 2>&1 || echo "C extensions not built: Python reads"
python3 -c "from hicache.backends.file_read import NATIVE_READ as n; print('C reads:', n)"
{
  echo "## trailer check vs copy (CPU)"
  timeout 90 python3 benchmarks/bench_page_checksum.py
  echo "## device checksum kernels (CUDA)"
  timeout 150 python3 benchmarks/bench_verify.py --tokens 16K --page-sizes 64 --repeats 5 \
    2>&1 | tail -22
  for t in 4 1; do
    echo "## file reads, read_threads=$t (1 GiB scale)"
    timeout 150 python3 benchmarks/bench_storage.py --batch-mib 512 --repeats 3 \
      --read-threads $t 2>&1 | tail -12
  done
  echo "## tests"
  timeout 120 python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/storage \
    tests/radix/test_storage_integrity.py tests/controller 2>&1 | tail -3
} 2>&1 | tee "$OUT/gpu32.log"
