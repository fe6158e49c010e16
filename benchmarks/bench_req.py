"""The request path with real pools on the CPU: what a scheduler pays per request.

Each request is 2,048 tokens sharing a 1,024-token prefix with the others: match, lock, allocate
the rest, write the row, then either ``cache_finished_req`` at once (``finish``) or four
512-token prefill chunks each ending in ``cache_unfinished_req`` and then the finish
(``chunked``). Times are median thread CPU time per request, in microseconds, over the cache
calls only (match + lock + cache_*_req), not the allocation and row writes around them.
Public APIs only, so the same script measures any checkout: ``PYTHONPATH=<checkout> python
benchmarks/bench_req.py``; run two checkouts alternately in one shell for an A/B.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np
import torch

from hicache.pools import MHATokenToKVPool, ReqToTokenPool, TokenToKVPoolAllocator
from hicache.radix import RadixCache, RadixKey, Req

TOKENS, SHARED, CHUNK = 2048, 1024, 512


def _stack(page: int, requests: int) -> tuple[RadixCache, TokenToKVPoolAllocator, ReqToTokenPool]:
    size = (requests + 2) * TOKENS
    size -= size % page
    kv = MHATokenToKVPool(size, page, torch.float16, 1, 8, 1, "cpu")
    allocator = TokenToKVPoolAllocator(size, page, "cpu", kvcache=kv)
    rows = ReqToTokenPool(4, TOKENS, "cpu")
    return RadixCache(rows, allocator, page), allocator, rows


def _run(page: int, requests: int, chunked: bool, seed: int) -> float:
    """Median CPU microseconds of the cache calls of one request."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, 32000, SHARED).tolist()
    prompts = [shared + rng.integers(0, 32000, TOKENS - SHARED).tolist() for _ in range(requests)]
    cache, allocator, rows = _stack(page, requests)
    gc.collect()
    samples = []
    for ids in prompts:
        spent = 0.0
        t = time.thread_time()
        m = cache.match_prefix(RadixKey(ids))
        cache.inc_lock_ref(m.last_device_node)
        spent += time.thread_time() - t
        prefix = len(m.device_indices)
        row = rows.alloc(1)[0]
        own = allocator.alloc(-(-(TOKENS - prefix) // page) * page)
        slots = torch.cat([m.device_indices, own[: TOKENS - prefix]]).to(torch.int32)
        rows.write((row, slice(0, TOKENS)), slots)
        req = Req(
            row,
            ids,
            kv_len=prefix,
            last_node=m.last_device_node,
            cache_protected_len=prefix,
            prefix_indices=m.device_indices,
        )
        ends = range(prefix + CHUNK, TOKENS, CHUNK) if chunked else []
        for end in ends:
            req.kv_len = end
            t = time.thread_time()
            cache.cache_unfinished_req(req)
            spent += time.thread_time() - t
        req.kv_len = TOKENS
        t = time.thread_time()
        cache.cache_finished_req(req)
        spent += time.thread_time() - t
        samples.append(spent * 1e6)
    return statistics.median(samples[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'page':>5} {'finish us/req':>14} {'chunked us/req':>15}")
    for page in (1, 16, 64):
        finish = min(_run(page, args.requests, False, r) for r in range(args.repeats))
        chunked = min(_run(page, args.requests, True, r) for r in range(args.repeats))
        print(f"{page:>5} {finish:>14.1f} {chunked:>15.1f}")


if __name__ == "__main__":
    main()
