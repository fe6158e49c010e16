"""TTFT per tier on one GPU: a device hit, a host hit, a file-store hit, a Mooncake hit, a miss.

The model of ``bench_overlap.py`` (Llama-3-8B geometry: 32 layers, hidden 4096, 32 query heads,
8 KV heads, head dim 128, MLP 14336, bf16, random weights: 128 KiB of KV a token) serves one
request at a time through the project's ``Engine`` over a ``HiRadixCache`` with the host tier
and a storage tier (cache defaults: write-through, ``io_backend="auto"``, every layer of a load
batch issued at once and read by the forward layer by layer; storage prefetch
``wait_complete``, queried from one page on). Per prefix length and round, a fresh random
prefix ``P`` and fresh ``--suffix``-token suffixes (one engine per storage backend):

* ``miss``: ``P + s0`` on an empty cache: the forward of the whole prompt (recompute);
  its write-through backups to the host and to storage land before the next phase.
* ``device``: ``P + s1``, ``P`` on the device.
* ``host``: ``P + s2`` with ``P`` evicted to the host: loaded back layer by layer under the
  forward of the suffix.
* ``file`` / ``mooncake``: ``P + s3`` after ``cache.reset()`` (device and host empty, the store
  kept): ``P`` read from the store into the host, then loaded as a host hit. The file store's
  page cache is dropped first where the kernel allows it (``--keep-page-cache``: not tried).

TTFT = the engine's ``first_token_time - arrival`` of that request (median over ``--repeats``).
GB/s: ``h2d`` is the cache's own host -> device figure for the request, bytes over busy time
timed by CUDA events on the load stream (``stats().transfer``); ``read`` is the storage
backend's bytes over the time inside its get calls. A tier that cannot run here (Mooncake not
installed, no loopback-only namespace) keeps its row with the reason.

Run (CUDA): ``PYTHONPATH=. python3 benchmarks/bench_ttft.py --json t.json --markdown t.md``
(Mooncake needs ``unshare --net`` with ``lo`` up and ``MC_TCP_BIND_ADDRESS=127.0.0.1``:
``scripts/gpu_35_ttft.sh``). ``--device cpu --quick``: the tiny geometry in seconds (a smoke
test; CPU copies are synchronous and its figures mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import describe_device, import_hicache, log, parse_sizes, pick_device
from _ttft_report import Sample, markdown, table
from bench_overlap import build_model

engine_mod = import_hicache("engine")
radix_mod = import_hicache("radix")
backends = import_hicache("backends")
servers_mod = import_hicache("backends.mooncake_servers")


def drop_page_cache() -> bool:
    """Write dirty pages back and drop the kernel's clean page cache; whether it was allowed."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    except OSError:
        return False
    return True


class Server:
    """An engine with the host tier and the storage tier ``storage`` (None: host tier only),
    and the requests of one round on it."""

    def __init__(self, model: Any, storage: Any, args: argparse.Namespace) -> None:
        page, longest = args.page, max(args.prefixes) + args.suffix
        tokens = -(-(5 * (longest + 4 * args.suffix) // 4) // page) * page
        hicache = radix_mod.HiCacheConfig(hicache_ratio=args.host_ratio, storage=storage)
        spec = engine_mod.CacheSpec("hiradix", tokens, page, longest + page, 8, hicache=hicache)
        config = engine_mod.EngineConfig(max_prefill_tokens=longest + page, stall_timeout_s=600.0)
        self.engine = engine_mod.build_engine(model, spec, config)
        self.cache = self.engine.cache
        self.gen = torch.Generator().manual_seed(args.seed)
        self.vocab, self.suffix = model.cfg.vocab_size, args.suffix
        self.drop = not args.keep_page_cache

    def tokens(self, n: int) -> list[int]:
        return torch.randint(0, self.vocab, (n,), generator=self.gen).tolist()

    def _counters(self) -> tuple[int, float, int, float]:
        stats = self.cache.stats()
        t, s = stats.transfer, stats.storage
        l3 = (0, 0.0) if s is None else (s.bytes_read, s.read_seconds)
        return t.h2d_bytes, t.h2d_seconds, *l3

    def serve(self, prefix: list[int], tier: str) -> Sample:
        """Serve ``prefix`` + a fresh suffix; its TTFT and what the ``tier`` measured moved."""
        before = self._counters()
        req = self.engine.submit(prefix + self.tokens(self.suffix), 1)
        while self.engine.has_work():
            self.engine.step()
        assert req.first_token_time is not None, req.error
        self.cache.drain_transfers()  # its own backups too: the next phase starts quiet
        after = self._counters()
        served = {"device": req.device_hit, "host": req.host_hit, "miss": req.computed}
        got = served.get(tier, req.storage_hit)
        d = [a - b for a, b in zip(after, before, strict=True)]
        l3 = (int(d[2]), d[3]) if tier in ("file", "mooncake") else None
        ttft = req.first_token_time - req.arrival
        return Sample(tier, len(prefix), ttft, got, (int(d[0]), d[1]), l3)

    def round(self, prefix_len: int, tiers: tuple[str, ...]) -> list[Sample]:
        """One round of ``tiers`` (in ``TIERS`` order) on a fresh prefix of ``prefix_len``."""
        self.cache.reset()
        prefix = self.tokens(prefix_len)
        samples = [self.serve(prefix, "miss")]
        for tier in tiers:
            if tier == "host":
                self.cache.evict(self.cache.evictable_size())
            if tier in ("file", "mooncake"):
                self.cache.reset()  # device and host empty; the store keeps P
                if tier == "file" and self.drop and not drop_page_cache():
                    self.drop = False
                    log("file: the page cache could not be dropped (reads may hit it)")
            samples.append(self.serve(prefix, tier))
        return samples

    def close(self) -> None:
        self.cache.drain_transfers()
        self.cache.reset()
        self.cache.close()
        self.cache.cache_controller.mem_pool_host.close()


def storage_config(backend: str, extra: dict[str, Any], page: int) -> Any:
    return backends.StorageConfig(
        backend=backend,
        extra_config=extra,
        model_id="bench-ttft",
        prefetch_policy="wait_complete",
        prefetch_threshold=page,
    )


def mooncake_server(model: Any, args: argparse.Namespace, stack: Any) -> Server:
    """An engine over a local Mooncake master and store on loopback (stopped with ``stack``);
    ``ImportError`` / ``RuntimeError`` / ... saying why when it cannot run here."""
    import mooncake.store  # noqa: F401 (the reason, when it is not installed)

    logs = stack.enter_context(tempfile.TemporaryDirectory(prefix="mooncake-logs-"))
    servers = stack.enter_context(
        servers_mod.start_servers(Path(logs), f"{args.segment_gb} GB", timeout_s=30.0)
    )
    extra = {"master_server_address": servers.master_address}
    server = Server(model, storage_config("mooncake", extra, args.page), args)
    stack.callback(server.close)
    return server


def run_all(model: Any, args: argparse.Namespace, report: Callable[..., None]) -> None:
    """Every round: per repeat and prefix, the file engine's tiers, then Mooncake's (both
    engines live, so a run cut short still has every tier); ``report(samples, notes)`` after
    each round, ``notes`` saying why a tier did not run."""
    samples: list[Sample] = []
    notes: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        root = stack.enter_context(
            tempfile.TemporaryDirectory(prefix="hicache-ttft-", dir=args.storage_dir)
        )
        file = Server(model, storage_config("file", {"root": root}, args.page), args)
        stack.callback(file.close)
        engines = {"file": (file, ("device", "host", "file"))}
        try:
            if args.no_mooncake:
                raise RuntimeError("--no-mooncake")
            engines["mooncake"] = (mooncake_server(model, args, stack), ("mooncake",))
        except (ImportError, OSError, RuntimeError, ValueError) as err:
            notes["mooncake"] = f"not run: {type(err).__name__}: {err}"
            log(f"mooncake: {notes['mooncake']}")
        for server, tiers in engines.values():
            server.round(min(args.prefixes), tiers)  # warm-up: kernels, allocator, store
        gc.disable()  # no collection pauses inside a timed request
        try:
            for _ in range(args.repeats):
                for prefix in args.prefixes:
                    for name, (server, tiers) in list(engines.items()):
                        samples += one_round(server, prefix, tiers, name, engines, notes)
                        report(samples, notes)
        finally:
            gc.enable()


def one_round(
    server: Server,
    prefix: int,
    tiers: tuple[str, ...],
    name: str,
    engines: dict[str, Any],
    notes: dict[str, str],
) -> list[Sample]:
    """``server.round``; a Mooncake round that fails drops its engine, noting why."""
    try:
        return server.round(prefix, tiers)
    except (OSError, RuntimeError) as err:
        if name != "mooncake":
            raise
        notes[name] = f"failed at {prefix} tokens: {type(err).__name__}: {err}"
        log(f"mooncake: {notes[name]}")
        del engines[name]
        return []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--quick", action="store_true", help="tiny geometry, small prefixes")
    parser.add_argument("--prefixes", default=None, help="default 1k,8k,32k,64k (quick 128,256)")
    parser.add_argument("--suffix", type=int, default=None, help="default 64 (quick 16)")
    parser.add_argument("--page", type=int, default=None, help="default 64 (quick 16)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--host-ratio", type=float, default=1.1)  # pinning takes time
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--storage-dir", default=None, help="parent of the file store's dir")
    parser.add_argument("--keep-page-cache", action="store_true")
    parser.add_argument("--no-mooncake", action="store_true")
    parser.add_argument("--segment-gb", type=int, default=40, help="the Mooncake store's size")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    args.prefixes = parse_sizes(args.prefixes or ("128,256" if args.quick else "1k,8k,32k,64k"))
    args.suffix = args.suffix or (16 if args.quick else 64)
    args.page = args.page or (16 if args.quick else 64)
    device = pick_device(args.device)
    geometry = "tiny" if args.quick else "llama3-8b"
    info = {"geometry": geometry, "suffix": args.suffix, "page": args.page,
            "repeats": args.repeats, **describe_device(device)}  # fmt: skip
    text = ""

    def report(samples: list[Sample], notes: dict[str, str]) -> None:
        """Write the JSON and markdown of ``samples`` so far (a run cut short keeps them)."""
        nonlocal text
        rows = table(samples, args.prefixes, notes)
        text = markdown(rows, info, notes)
        if args.json:
            done = {**info, "rows": rows, "notes": notes,
                    "samples": [s.as_dict() for s in samples]}  # fmt: skip
            Path(args.json).write_text(json.dumps(done, indent=1))
        if args.markdown:
            Path(args.markdown).write_text(text)

    run_all(build_model(geometry, device), args, report)
    print(text)


if __name__ == "__main__":
    main()
