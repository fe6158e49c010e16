#!/usr/bin/env bash
# Issue 35, helper `match`: match_prefix on CUDA slots. Runs the lazy-join tests (the CUDA one:
# match and join under torch.cuda.set_sync_debug_mode("error")) and times match_prefix of a
# 128k-token key (1 node / a chain of 64) with and without reading device_indices (the join:
# one torch.cat on the GPU). Builds hicache.radix.cpack in place when a compiler is there (else
# the numpy walk runs). Writes $OUT/match_tests.log and $OUT/match_cuda.json; table last.
set -euo pipefail
OUT=${OUT:-results}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 setup.py -q build_ext --inplace >/dev/null 2>&1 || echo "cpack not built: numpy walk"
timeout 150 python3 -m pytest -q -o addopts="" -p no:cacheprovider -rfE \
  tests/radix/test_match_result.py tests/radix/test_cpack.py 2>&1 | tee "$OUT/match_tests.log" | tail -4
timeout 60 python3 - "$OUT/match_cuda.json" <<'PY'
import json, sys, time
import torch
from hicache.radix import RadixCache, RadixKey
from hicache.radix.key import match_len, numpy_match_len

class Alloc:  # a pool-less allocator on the GPU: the tree only frees to it
    def __init__(self):
        self.page_size, self.device = 1, torch.device("cuda")
    def free(self, indices):
        pass

def median_us(fn, n=51):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return sorted(ts)[n // 2] * 1e6

L, rows = 131072, {}
toks = torch.randint(0, 32000, (L,)).tolist()
vals = torch.arange(L, dtype=torch.int64, device="cuda")
for layout in ("1node", "chain"):
    cache = RadixCache(None, Alloc(), 1)
    for end in ([L] if layout == "1node" else range(2048, L + 1, 2048)):
        cache.insert(RadixKey(toks[:end]), vals[:end])
    key = RadixKey(toks)
    assert torch.equal(cache.match_prefix(key).device_indices, vals)
    torch.cuda.synchronize()
    rows[layout] = {"match_us": median_us(lambda: cache.match_prefix(key)),
                    "match_and_read_us": median_us(lambda: cache.match_prefix(key).device_indices)}
info = {"gpu": torch.cuda.get_device_name(), "cpack": match_len is not numpy_match_len, "rows": rows}
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(f"match_prefix 128k on {info['gpu']} (cpack {info['cpack']}), median us:")
print("| layout | match | match + device_indices |")
for k, r in rows.items():
    print(f"| {k} | {r['match_us']:.1f} | {r['match_and_read_us']:.1f} |")
PY
