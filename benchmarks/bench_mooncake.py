"""Benchmark hicache's MooncakeStore against Mooncake Store's own zero-copy batch calls.

Run inside a loopback-only network namespace (it starts its own master and standalone store,
whose clients listen on 0.0.0.0; it refuses to run elsewhere)::

    unshare --net bash -c 'ip link set lo up && MC_TCP_BIND_ADDRESS=127.0.0.1 \
        python benchmarks/bench_mooncake.py'

For each object size (64 KiB, 256 KiB, 1 MiB) an MHA host pool of ``--pages`` pages (two
objects per page) is written with fresh keys and read back, ``--reps`` times (the store is
cleared between repetitions): hicache's ``batch_set_v1`` / ``batch_get_v1`` on a page_first
pool (zero-copy) and on a layer_first pool (staged through a copy), against the store's own
``batch_put_from`` / ``batch_get_into`` from the same page_first pool addresses. Medians, GB/s
(1e9 bytes per second) of object bytes; ``ratio`` = hicache page_first / raw. A writer and a
reader with no segment of their own, data in the standalone store (as in serving).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import format_table  # noqa: E402
from hicache.backends.keys import object_keys  # noqa: E402
from hicache.backends.mooncake import MooncakeStore  # noqa: E402
from hicache.backends.mooncake_servers import isolation_problem, start_servers  # noqa: E402
from hicache.backends.pages import PageIO  # noqa: E402
from hicache.pools import MHATokenToKVPool, MHATokenToKVPoolHost  # noqa: E402

PAGE, LAYERS, DIM = 16, 4, 128  # object bytes = PAGE * LAYERS * heads * DIM * 2 = 16 KiB * heads
SIZES = {"64 KiB": 4, "256 KiB": 16, "1 MiB": 64}  # heads for each object size


def pool(heads: int, pages: int, layout: str) -> MHATokenToKVPoolHost:
    device = MHATokenToKVPool(pages * PAGE // 2, PAGE, torch.float16, heads, DIM, LAYERS, "cpu")
    host = MHATokenToKVPoolHost(device, 2.0, 0, PAGE, layout, pin_memory=False)
    for part in host.host_parts:
        part.view(torch.uint8).random_(0, 256)
    return host


def seconds(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def raw_client(master: str) -> Any:
    from mooncake.store import MooncakeDistributedStore

    raw = MooncakeDistributedStore()
    if raw.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master) != 0:
        raise SystemExit("raw Mooncake client setup failed")
    return raw


def run_size(master: str, heads: int, pages: int, reps: int) -> dict[str, float]:
    """Median seconds of each of the six calls for one object size."""
    pools = {layout: pool(heads, pages, layout) for layout in ("page_first", "layer_first")}
    stores = {}
    for layout, host in pools.items():
        stores[layout] = MooncakeStore(master_server_address=master)
        stores[layout].register_mem_pool_host(host)
    raw = raw_client(master)
    io = PageIO(pools["page_first"])
    idx = torch.arange(pages * PAGE, dtype=torch.int64)
    ptrs = [a for p in range(pages) for a in io.address(p * PAGE)]
    sizes = [io.object_bytes] * len(ptrs)
    times: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        took, result = seconds(fn)
        times.setdefault(name, []).append(took)
        return result

    for _ in range(reps):
        for name, store in stores.items():
            keys = [f"bench_{uuid.uuid4().hex}_{i}" for i in range(pages)]
            assert all(timed(f"set {name}", partial(store.batch_set_v1, keys, idx)))
            assert all(timed(f"get {name}", partial(store.batch_get_v1, keys, idx)))
            store.clear()
        okeys = [o for i in range(pages) for o in object_keys(f"bench_{uuid.uuid4().hex}_{i}", 2)]
        assert timed("put raw", partial(raw.batch_put_from, okeys, ptrs, sizes)) == [0] * len(ptrs)
        assert timed("get raw", partial(raw.batch_get_into, okeys, ptrs, sizes)) == sizes
        stores["page_first"].clear()
    for store in stores.values():
        store.close()
    raw.close()
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=48, help="pages per batch (2 objects each)")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    problem = isolation_problem()
    if problem is not None:
        raise SystemExit(f"bench_mooncake: {problem}")
    rows = []
    with (
        tempfile.TemporaryDirectory() as logs,
        start_servers(Path(logs), "768 MB", lease_ttl_ms=10_000) as servers,
    ):
        for label, heads in SIZES.items():
            t = run_size(servers.master_address, heads, args.pages, args.reps)
            nbytes = args.pages * 2 * PAGE * LAYERS * heads * DIM * 2

            def gbps(name: str, t: dict[str, float] = t, nbytes: int = nbytes) -> float:
                return nbytes / t[name] / 1e9

            row = [label, str(args.pages)]
            for op, raw_op in (("set", "put raw"), ("get", "get raw")):
                pf, lf, raw = gbps(f"{op} page_first"), gbps(f"{op} layer_first"), gbps(raw_op)
                row += [f"{pf:.2f}", f"{lf:.2f}", f"{raw:.2f}", f"{pf / raw:.2f}"]
            rows.append(row)
    header = ["object", "pages", "set pf", "set lf", "put_from", "ratio",
              "get pf", "get lf", "get_into", "ratio"]  # fmt: skip
    title = (
        f"hicache MooncakeStore vs Mooncake batch_put_from/batch_get_into, GB/s, median of "
        f"{args.reps} (pf: page_first zero-copy, lf: layer_first staged; ratio = pf / raw)"
    )
    print(format_table(header, rows, title))


if __name__ == "__main__":
    main()
