#!/usr/bin/env bash
# Issue 35: TTFT per tier on one GPU (benchmarks/bench_ttft.py): device, host, file-store and
# Mooncake hits and a miss, prefixes 1k/8k/32k/64k, Llama-3-8B geometry. Mooncake Store comes
# from carried wheels and libraries (`run` carry [".whl", ".deb"]; only the sonames missing
# here are used from .deb) and runs on loopback inside `unshare --net`; without it the
# Mooncake row says why. Writes $OUT/ttft.json and $OUT/ttft.md (rewritten after each round, so
# a run cut short keeps what it measured) and prints the table last. ~3-4 min on an H100.
set -euo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=.:/tmp/site PATH=/tmp/site/bin:$PATH \
    || echo "gpu_35_ttft: the Mooncake wheel did not install"
fi
if ls .deb/*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/deb /tmp/deblib && for f in .deb/*.deb; do dpkg -x "$f" /tmp/deb; done
  have=$(ldconfig -p)
  for lib in /tmp/deb/usr/lib/x86_64-linux-gnu/*.so.* /tmp/deb/lib/x86_64-linux-gnu/*.so.*; do
    [ -e "$lib" ] || continue
    name=$(basename "$lib")
    grep -q "^[[:space:]]$name " <<<"$have" || ln -sf "$lib" "/tmp/deblib/$name"
  done
  export LD_LIBRARY_PATH=/tmp/deblib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "gpu_35_ttft: libraries taken from .deb: $(ls /tmp/deblib | tr '\n' ' ')"
fi
python3 -c "import mooncake.store; print('gpu_35_ttft: mooncake importable')" 2>&1 | tail -1 || true
ARGS=(--json "$OUT/ttft.json" --markdown "$OUT/ttft.md" ${TTFT_ARGS:-})
BENCH="python3 benchmarks/bench_ttft.py ${ARGS[*]}"
rc=0
if unshare --net true 2>/dev/null; then
  timeout "${TTFT_TIMEOUT:-220}" unshare --net bash -c "python3 scripts/lo_up.py && \
    MC_TCP_BIND_ADDRESS=127.0.0.1 exec $BENCH" >"$OUT/ttft.log" 2>&1 || rc=$?
else
  echo "gpu_35_ttft: no unshare --net here: Mooncake cannot be isolated (its row says so)"
  timeout "${TTFT_TIMEOUT:-220}" $BENCH >"$OUT/ttft.log" 2>&1 || rc=$?
fi
grep -v '^[IWE][0-9]' "$OUT/ttft.log" | tail -40 || true  # Mooncake's glog lines left out
rm -f "$OUT/ttft.log"  # two result files at most
[ "$rc" = 0 ] || echo "gpu_35_ttft: bench_ttft.py ended with $rc (124: timed out); table so far:"
cat "$OUT/ttft.md" 2>/dev/null || echo "gpu_35_ttft: no table written"
