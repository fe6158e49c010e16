"""Throughput of the embedded storage backends per page object size, against plain files.

Run: ``python3 benchmarks/bench_storage.py [--batch-mib 16] [--repeats 7] [--dir DIR]
[--json PATH]``.

For each object size (64 KiB, 256 KiB, 1 MiB by default) a page_first MLA host pool (one object
per page, zero-copy) holds twice ``--batch-mib`` of random bytes (at least 16 pages). Each
repeat takes fresh keys and times one ``batch_set_v1`` of every page, one ``batch_exists`` and
one ``batch_get_v1`` into other host slots, on ``HiCacheFile`` (in a temporary directory, cap
far above the data) and on ``MemoryStorage``. The baseline is the same bytes as plain files: a
temporary file written and ``os.replace``d per object, ``readinto`` the same host views,
``os.path.exists`` per object. Medians over repeats. Files stay in the page cache (the case the
file tier is for: a reread on one machine); the directory is removed at the end. Progress goes
to stderr, the markdown table to stdout, last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hicache.backends import HiCacheStorage, KVFingerprint, PageIO, StorageKeys  # noqa: E402
from hicache.backends.fanout import DEFAULT_THREADS  # noqa: E402
from hicache.backends.file import HiCacheFile  # noqa: E402
from hicache.backends.memory import MemoryStorage  # noqa: E402
from hicache.pools.mla_pool import MLATokenToKVPool, MLATokenToKVPoolHost  # noqa: E402

KIB = 1024
PAGE = 16  # tokens per page; layers set the object size (1 KiB per token and layer)
OPS = ("set", "get", "exists")


def _host(object_bytes: int, pages: int) -> Any:
    layers = object_bytes // (PAGE * KIB)
    dev = MLATokenToKVPool(pages * PAGE, PAGE, torch.bfloat16, 512, 0, layers, "cpu")
    host = MLATokenToKVPoolHost(dev, 2.0, 0, PAGE, "page_first", pin_memory=False)
    host.host_parts[0].view(torch.uint8).view(-1).random_(0, 256)
    return host


def _keys(host: Any, pages: int) -> list[str]:
    fp = KVFingerprint("bench", "0", "bf16", 1, 512, host.layer_num, PAGE, "page_first", True)
    return StorageKeys(fp).page_keys([os.urandom(32) for _ in range(pages)])


def _timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _backend_round(store: HiCacheStorage, host: Any, pages: int) -> dict[str, float]:
    keys = _keys(host, pages)
    src = torch.arange(pages * PAGE)
    dst = src + pages * PAGE
    times = {
        "set": _timed(lambda: store.batch_set_v1(keys, src)),
        "exists": _timed(lambda: store.batch_exists(keys)),
        "get": _timed(lambda: store.batch_get_v1(keys, dst)),
    }
    assert store.batch_exists(keys) == pages, "a page went missing: is the cap too small?"
    store.clear()
    return times


def _plain_round(root: Path, host: Any, pages: int) -> dict[str, float]:
    io = PageIO(host)
    paths = [str(root / f"{k}.bin") for k in _keys(host, pages)]

    def write() -> None:
        for path, slot in zip(paths, range(0, pages * PAGE, PAGE), strict=True):
            tmp = f"{path}.tmp.{uuid.uuid4().hex}"
            with open(tmp, "wb", buffering=0) as f:
                f.write(io.source(slot)[0].data)
            os.replace(tmp, path)

    def read() -> None:
        for path, slot in zip(paths, range(pages * PAGE, 2 * pages * PAGE, PAGE), strict=True):
            with open(path, "rb", buffering=0) as f:
                f.readinto(io.target(slot)[0].data)

    times = {"set": _timed(write), "exists": _timed(lambda: all(map(os.path.exists, paths)))}
    times["get"] = _timed(read)
    for path in paths:
        os.unlink(path)
    return times


def measure(
    object_bytes: int, pages: int, repeats: int, root: Path, read_threads: int = DEFAULT_THREADS
) -> list[dict[str, Any]]:
    host = _host(object_bytes, pages)
    file_store = HiCacheFile(root=root / "file", max_bytes=1 << 40, read_threads=read_threads)
    memory = MemoryStorage()
    for store in (file_store, memory):
        store.register_mem_pool_host(host)
    (root / "plain").mkdir(exist_ok=True)
    runs: dict[str, list[dict[str, float]]] = {"file": [], "memory": [], "plain": []}
    for _ in range(repeats):  # interleaved, so host noise hits every variant alike
        runs["file"].append(_backend_round(file_store, host, pages))
        runs["memory"].append(_backend_round(memory, host, pages))
        runs["plain"].append(_plain_round(root / "plain", host, pages))
    rows = []
    for op in OPS:
        med = {name: statistics.median(r[op] for r in rs) for name, rs in runs.items()}
        work = pages if op == "exists" else pages * object_bytes  # pages, or bytes moved
        rates = {name: work / t / (1e3 if op == "exists" else 1e9) for name, t in med.items()}
        rows.append({"object_bytes": object_bytes, "op": op, "pages": pages, **rates})
    file_store.close()
    memory.close()
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = "| object | op | unit | file | plain file | file / plain | memory |"
    out = [head, "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        unit = "k pages/s" if r["op"] == "exists" else "GB/s"
        out.append(
            f"| {r['object_bytes'] // KIB} KiB | {r['op']} | {unit} | {r['file']:.2f} | "
            f"{r['plain']:.2f} | {r['file'] / r['plain']:.2f} | {r['memory']:.2f} |"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-kib", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--batch-mib", type=int, default=16, help="bytes per batch call")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--read-threads", type=int, default=DEFAULT_THREADS, help="the file store's read threads"
    )
    parser.add_argument("--dir", default=None, help="parent of the temporary directory")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_storage_", dir=args.dir))
    rows = []
    try:
        for kib in args.sizes_kib:
            print(f"measuring {kib} KiB objects ...", file=sys.stderr, flush=True)
            pages = max(16, args.batch_mib * 1024 // kib)
            rows += measure(kib * KIB, pages, args.repeats, root, args.read_threads)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"root_fs": args.dir or "/tmp", "rows": rows}))
    print(markdown(rows))


if __name__ == "__main__":
    main()
