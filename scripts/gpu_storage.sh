#!/usr/bin/env bash
# One device-machine call for the storage tier (L3): Mooncake Store from carried wheels (.whl,
# and libibverbs from .deb: `run` carry [".whl", ".deb"]), the storage tests on CUDA, the
# Mooncake tests in a loopback-only namespace, then `hicache bench --storage file|mooncake` on
# the GPU (BENCH_ARGS). Logs under $OUT.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=.:/tmp/site PATH=/tmp/site/bin:$PATH
fi
if ls .deb/*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/deb && for f in .deb/*.deb; do dpkg -x "$f" /tmp/deb; done
  export LD_LIBRARY_PATH=/tmp/deb/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi
python3 -c "import mooncake.store; print('mooncake importable')" 2>&1 | tail -1
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -rfE -p no:cacheprovider \
  ${STORAGE_TESTS:-tests/radix/test_storage_tier.py tests/storage tests/storage_guard tests/engine tests/bench} \
  2>&1 | tee "$OUT/storage_tests.log" | tail -6
NS='python3 scripts/lo_up.py && export MC_TCP_BIND_ADDRESS=127.0.0.1 &&'
timeout 120 unshare --net bash -c "$NS python3 -m pytest -q -m mooncake -p no:cacheprovider tests/storage_mooncake" \
  2>&1 | tee "$OUT/mooncake_tests.log" | tail -4
ARGS=${BENCH_ARGS:---users 16 --rounds 3}
timeout "${BENCH_TIMEOUT:-150}" python3 -m hicache bench --no-progress --storage file $ARGS \
  --out-dir "$OUT/bench_file" 2>&1 | tee "$OUT/bench_file.log" | tail -24
timeout "${BENCH_TIMEOUT:-150}" unshare --net bash -c "$NS python3 -m hicache.backends.mooncake_servers \
  --segment '${SEGMENT:-16 GB}' python3 -m hicache bench --no-progress --storage mooncake $ARGS \
  --out-dir $OUT/bench_mooncake" 2>&1 | tee "$OUT/bench_mooncake.log" | tail -24
