"""``hicache replay``'s options: the flag tables and ``add_options`` (the command is
``hicache.replay.cli``)."""

from __future__ import annotations

import argparse

from hicache.bench.model_flags import CHECKPOINT_FORMS
from hicache.controller import TIERINGS, WRITE_POLICIES
from hicache.metrics import add_metrics_flags
from hicache.pools import IO_BACKENDS, LAYOUTS
from hicache.radix import EVICTION_POLICIES
from hicache.replay.config import DTYPES, GEOMETRY, STORAGES, ReplayConfig
from hicache.replay.generate import PRESETS, GenerateSpec
from hicache.replay.hybrid import DEFAULT_STATE_MODEL, STATE_MODELS
from hicache.replay.trace import BLOCK_TOKENS

_INTS = {
    "device-tokens": "device KV pool size in tokens",
    "page-size": "tokens per page",
    "max-running": "requests admitted at once",
    "max-prefill-tokens": "prompt tokens per iteration",
    "layers": "KV layers",
    "kv-heads": "KV heads",
    "head-dim": "head dim",
    "load-back-threshold": "shortest host hit worth loading, tokens",
    "storage-capacity": "storage tier size in tokens (default: no cap for memory, the file "
    "store's default cap for file)",
    "threads": "torch CPU threads (default 1 on cpu: more spin against each other on small "
    "shared machines and run many times slower)",
}
_FLOATS = {
    "host-ratio": "host pool / device pool (any > 0; 0: no host tier)",
    "prefill-tps": "modelled prefill tokens/s",
    "decode-step-ms": "modelled decode iteration time",
    "h2d-gbps": "host->device GB/s for the clock",
    "d2h-gbps": "device->host GB/s for the clock",
    "storage-gbps": "storage read GB/s for the clock",
}
_CHOICES = {  # flag: (ReplayConfig field, choices, help)
    "dtype": ("dtype", sorted(DTYPES), "KV dtype"),
    "policy": ("eviction_policy", sorted(EVICTION_POLICIES), "eviction order of the tree"),
    "write-policy": ("write_policy", list(WRITE_POLICIES), "when device KV is copied to host"),
    "io-backend": ("io_backend", list(IO_BACKENDS), "how host<->device copies run"),
    "mem-layout": ("mem_layout", list(LAYOUTS), "host pool layout"),
    "storage": (
        "storage",
        list(STORAGES),
        "storage tier below the host (file: a temporary directory, removed at the end)",
    ),
    "tiering": ("tiering", list(TIERINGS), "device<->host tiering"),
    "storage-tiering": ("storage_tiering", list(TIERINGS), "host<->storage tiering"),
}
GENERATE_OPTIONS = {  # GenerateSpec field: help (hicache.replay.generate's module docstring)
    "sessions": "conversations",
    "turns": "turns per conversation",
    "system_prompts": "distinct system prompts, one per session picked uniformly",
    "system_tokens": "tokens of each system prompt",
    "docs": "distinct documents, one per session picked by popularity (0: none)",
    "doc_tokens": "tokens of each document",
    "zipf": "Zipf exponent of document popularity",
    "turn_tokens": "new user tokens per turn",
    "output_tokens": "generated tokens per turn",
    "session_rate": "conversation starts per second, Poisson (0: all at time 0)",
    "turn_gap_s": "turn r arrives r * turn_gap_s seconds after its conversation starts",
    "seed": "RNG seed",
}
_DEFAULTS = ReplayConfig()


def _default(flag: str) -> str:
    """`` (default ...)`` of ReplayConfig field ``flag``: per device for the KV geometry."""
    name = flag.replace("-", "_")
    if name in GEOMETRY["cpu"]:
        return f" (default: {GEOMETRY['cpu'][name]} on cpu, {GEOMETRY['cuda'][name]} on cuda)"
    value = getattr(_DEFAULTS, name, None)
    return " (default: measured on these pools)" if value is None else f" (default {value})"


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", nargs="?", help="Mooncake-format JSONL trace")
    for kind, options in ((int, _INTS), (float, _FLOATS)):
        for name, help_ in options.items():
            text = help_ if "default" in help_ else help_ + _default(name)
            p.add_argument(f"--{name}", type=kind, help=text)
    p.add_argument("--block-tokens", type=int, default=BLOCK_TOKENS, help="tokens per hash id")
    p.add_argument("--device", help="cpu (default) or cuda[:N]")
    for flag, (dest, names, help_) in _CHOICES.items():
        p.add_argument(f"--{flag}", dest=dest, choices=names, help=help_ + _default(dest))
    p.add_argument("--skip-bad", action="store_true", help="skip (and count) bad trace lines")
    p.add_argument("--limit", type=int, help="replay only the first N requests (default: all)")
    p.add_argument(
        "--sweep",
        help="a grid, NAME=V1,V2,...[,NAME=V1,...] over device-tokens, host-ratio, "
        "storage-capacity, tiering, storage-tiering (e.g. device-tokens=8192,16384,"
        "tiering=inclusive,exclusive)",
    )
    p.add_argument("--out-dir", default="replay_out", help="where the JSON and PNG go")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--check-invariants",
        action="store_true",
        help="check the whole cache after each replay (slow; memory several times the tree's)",
    )
    add_metrics_flags(p)
    _add_hybrid(p)
    g = p.add_argument_group("synthetic trace (hicache.replay.generate)")
    g.add_argument("--generate", metavar="OUT", help="write a generated trace to OUT, replay it")
    g.add_argument("--generate-only", action="store_true", help="write it, do not replay")
    g.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="start from a named spec; the flags below change it",
    )
    spec = GenerateSpec()
    for name, help_ in GENERATE_OPTIONS.items():
        default = getattr(spec, name)
        flag = f"--{name.replace('_', '-')}"
        g.add_argument(flag, type=type(default), help=f"{help_} (default: {default})")


def _add_hybrid(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("hybrid model (hicache.replay.hybrid)")
    g.add_argument(
        "--layers-pattern",
        help="one of F (full attention), S (sliding window), L (linear recurrent) per layer, "
        "e.g. FSL; sets --layers (default: full attention)",
    )
    g.add_argument("--window", type=int, help="keys an S layer sees" + _default("window"))
    g.add_argument(
        "--state-slots",
        type=int,
        help="device recurrent-state slots, rows included (default: the engine's, "
        "max-running + 1 plus one per 64 device tokens)",
    )
    g.add_argument(
        "--checkpoint", help=f"where states are taken: {CHECKPOINT_FORMS}" + _default("checkpoint")
    )
    g.add_argument(
        "--state-bytes",
        help="bytes of one recurrent state of the modelled model, or one of "
        f"{sorted(STATE_MODELS)} (default: {DEFAULT_STATE_MODEL}, {_DEFAULTS.state_bytes:,})",
    )
