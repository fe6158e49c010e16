"""``hicache`` command line: ``bench`` (the main job), ``replay`` (request traces) and
``selfcheck``.

Bad arguments exit with status 2 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from typing import Any

from hicache.cli import (
    HelpFormatter,
    OneLineParser,
    add_kv_events,
    add_log_level,
    plain,
    setup_logging,
)
from hicache.controller import WRITE_POLICIES
from hicache.metrics import add_metrics_flags
from hicache.pools import IO_BACKENDS, LAYOUTS
from hicache.radix import EVICTION_POLICIES


def _preset(name: str) -> str:
    """`` (cpu X, cuda Y)``: the presets' values of option ``name``."""
    from hicache.bench.presets import CPU_DEFAULTS, CUDA_DEFAULTS

    key = name.replace("-", "_")
    if key not in CPU_DEFAULTS:
        return ""
    cpu, cuda = CPU_DEFAULTS[key], CUDA_DEFAULTS[key]
    cuda = "torch's" if cuda is None else cuda
    return f" (default {cpu})" if cpu == cuda else f" (default: cpu {cpu}, cuda {cuda})"


def _field_default(name: str) -> str:
    from dataclasses import fields

    from hicache.bench.config import BenchConfig

    found: dict[str, Any] = {f.name: f.default for f in fields(BenchConfig)}
    value = found.get(name.replace("-", "_"))
    return "" if value is None else f" (default {value})"


def _bench_options(p: argparse.ArgumentParser) -> None:
    ints = {
        "users": "concurrent conversations",
        "rounds": "turns per conversation",
        "system-len": "shared system prompt tokens",
        "prompt-len": "new user tokens per turn",
        "answer-len": "generated tokens per turn",
        "layers": "transformer layers",
        "heads": "query heads",
        "kv-heads": "KV heads (GQA)",
        "head-dim": "head dim",
        "intermediate": "MLP width",
        "vocab": "vocabulary size",
        "device-tokens": "device KV pool size (tokens)",
        "page-size": "tokens per page",
        "max-running": "requests batched at once",
        "max-prefill-tokens": "prefill chunk size",
        "load-back-threshold": "shortest host hit worth loading (tokens)",
        "seed": "RNG seed",
        "threads": "torch CPU threads during the run",
        "tp": "tensor-parallel ranks: processes over loopback, each holding its shard of the "
        "heads, MLP and KV (with --device cuda rank r on cuda:{r %% GPUs}); fails unless "
        "every rank saw the same hit rates",
    }
    for name, help_ in ints.items():
        p.add_argument(f"--{name}", type=int, help=help_ + (_preset(name) or _field_default(name)))
    p.add_argument(
        "--arrival-rate", type=float, help="first-turn arrivals per second (default 0: all at t=0)"
    )
    p.add_argument(
        "--host-ratio",
        type=float,
        help="host pool size / device pool size (> 0)" + _field_default("host_ratio"),
    )
    p.add_argument("--device", help="cpu or cuda[:N] (default: cuda when available)")
    p.add_argument(
        "--layers-pattern",
        help="one letter per layer: F full attention, S sliding window (16 tokens), L linear "
        "recurrent, e.g. FSLFSL; sets --layers (if given, it must agree). With S or L the "
        "host and storage tiers carry the SWA KV and recurrent states",
    )
    choices: dict[str, tuple[str, list[str], str]] = {  # flag: (field, choices, help)
        "dtype": ("dtype", ["float32", "bfloat16", "float16"], "KV and model dtype"),
        "attention": ("attention", ["mha", "mla"], "MHA/GQA or MLA (latent KV) attention"),
        "policy": ("eviction_policy", sorted(EVICTION_POLICIES), "eviction order of the tree"),
        "write-policy": ("write_policy", list(WRITE_POLICIES), "when device KV is copied to host"),
        "io-backend": ("io_backend", list(IO_BACKENDS), "how host<->device copies run"),
        "mem-layout": ("mem_layout", list(LAYOUTS), "host pool layout"),
    }
    for flag, (dest, options, help_) in choices.items():
        default = _preset(dest) or _field_default(dest)
        p.add_argument(f"--{flag}", dest=dest, choices=options, help=help_ + default)
    p.add_argument("--out-dir", help="where results.json and rounds.png go (default bench_out)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_log_level(p)
    add_metrics_flags(p)
    add_kv_events(p)
    _state_options(p)
    _storage_options(p)
    _sglang_options(p)


def _state_options(p: argparse.ArgumentParser) -> None:
    """The recurrent states of a model with L layers (bench/model_flags.py)."""
    from hicache.bench.model_flags import CHECKPOINT_FORMS, QWEN3_NEXT_STATE_BYTES

    g = p.add_argument_group(
        "recurrent states (a --layers-pattern with L layers)",
        "where the cache keeps the linear layers' state and how many; the report counts them "
        "at the end and at peak, on the device and the host",
    )
    g.add_argument(
        "--state-slots",
        type=int,
        help="device state slots, R = --max-running + 1 rows' own and the checkpoints: >= 2R "
        "(default R + max(R, --device-tokens / 64): 133 on the CPU preset)",
    )
    g.add_argument(
        "--checkpoint",
        help=f"where a state is taken: {CHECKPOINT_FORMS} (finish: each request's end; branch: "
        "where a prompt leaves the cached prefix; every:N: a prefill chunk end past a multiple "
        "of N tokens, N a multiple of --page-size) (default finish+branch)",
    )
    g.add_argument(
        "--state-bytes",
        type=int,
        help="bytes one state stands for in the report (default "
        f"{QWEN3_NEXT_STATE_BYTES:,}: Qwen3-Next-80B-A3B's 36 GDN layers)",
    )


def _storage_options(p: argparse.ArgumentParser) -> None:
    """``--storage`` and its settings (bench/storage_run.py)."""
    from hicache.backends.config import PREFETCH_POLICIES
    from hicache.bench.config import STORAGE_BACKENDS

    g = p.add_argument_group(
        "storage tier (L3)",
        "with --storage: the workload cold over the storage tier, then the same conversations "
        "in a fresh process (empty device and host tiers) warm from storage; "
        "--page-size defaults to 64 here",
    )
    g.add_argument("--storage", choices=STORAGE_BACKENDS, help="the storage backend")
    g.add_argument("--storage-dir", help="the file store's directory (default: a temporary one)")
    g.add_argument(
        "--mooncake-master",
        help="host:port of mooncake_master (default $HICACHE_MOONCAKE_MASTER_SERVER_ADDRESS; "
        "other settings from HICACHE_MOONCAKE_*)",
    )
    g.add_argument(
        "--prefetch-policy",
        choices=PREFETCH_POLICIES,
        help="when a request waiting on storage runs" + _field_default("prefetch_policy"),
    )
    g.add_argument(
        "--prefetch-threshold",
        type=int,
        help="shortest miss worth asking storage for (tokens)"
        + _field_default("prefetch_threshold"),
    )


def _sglang_options(p: argparse.ArgumentParser) -> None:
    """SGLang bench_multiturn's names for the same settings (bench/presets.SGLANG_MULTITURN)."""
    from hicache.bench.config import ARRIVALS
    from hicache.bench.presets import SGLANG_MULTITURN

    g = p.add_argument_group(
        "SGLang bench_multiturn names",
        "the same settings under the names of SGLang's multi-turn benchmark; "
        "their clients share no system prompt (add --system-len 0 to match)",
    )
    for name, ours in SGLANG_MULTITURN.items():
        flag, mine = "--" + name.replace("_", "-"), "--" + ours.replace("_", "-")
        if name == "distribution":
            g.add_argument(flag, dest=ours, choices=ARRIVALS, help="first-turn arrival process")
        else:
            kind = float if name == "request_rate" else int
            g.add_argument(flag, dest=ours, type=kind, help=f"= {mine}")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="hicache", description=plain(" ".join(__doc__.split("\n\n")[0].split()))
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    bench = sub.add_parser(
        "bench",
        formatter_class=HelpFormatter,
        help="multi-turn chat: device-only vs host tier",
        description="A multi-turn chat workload run twice: device-only radix cache, then with "
        "the host tier. Options left unset take the CPU or CUDA preset of --device "
        "(hicache/bench/config.py). About 80 s on 2 CPU cores with the defaults.",
    )
    _bench_options(bench)
    replay = sub.add_parser(
        "replay",
        formatter_class=HelpFormatter,
        help="replay a request trace (Mooncake JSONL) through the real cache tiers",
        description="Replay a Mooncake-format trace through HiRadixCache and its real pools: "
        "per-tier hit rates, bytes moved, evictions (measured) and TTFT/throughput on a "
        "cost-model clock (modelled), next to the trace's ideal hit rate.",
    )
    from hicache.replay.options import add_options

    add_options(replay)
    add_log_level(replay)
    add_kv_events(replay)
    sub.add_parser(
        "selfcheck", help="offload/reload KV through every host layout and backend", add_help=False
    )
    return parser


def _check_extras(args: argparse.Namespace) -> None:
    """Raise ImportError naming the extra an option needs when it is not installed."""
    if args.storage == "mooncake" and importlib.util.find_spec("mooncake") is None:
        raise ImportError(
            "--storage mooncake needs Mooncake Store: pip install 'hicache[mooncake]' "
            "(and apt-get install libibverbs1)"
        )


def _bench(args: argparse.Namespace) -> int:
    from hicache.bench import BenchConfig, run_bench, run_storage_bench
    from hicache.bench.tp_run import TPMismatch
    from hicache.tp import RankFailed

    try:
        _check_extras(args)
        cfg = BenchConfig.from_args(vars(args))
        logging.getLogger("hicache.bench").info("config: %s", cfg.to_dict())
        run = run_bench if cfg.storage is None else run_storage_bench
        run(cfg, progress=not args.no_progress)
    except (ValueError, TypeError, OSError, ImportError) as err:  # ImportError: a missing extra
        sys.stderr.write(f"hicache bench: error: {err}\n")
        return 2
    except (TPMismatch, RankFailed) as err:
        sys.stderr.write(f"hicache bench: error: {err}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("\nhicache bench: interrupted\n")
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["selfcheck"]:
        from hicache.selfcheck import main as selfcheck_main

        return selfcheck_main(argv[1:])
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    if args.command == "replay":
        from hicache.replay.cli import main as replay_main

        return replay_main(args)
    return _bench(args)


if __name__ == "__main__":
    sys.exit(main())
