"""``python -m hicache.stress``: seeded random stress of HiRadixCache over a config matrix.

Examples::

    python -m hicache.stress --ops 10000 --faults 0.02     # the README's run: minutes
    python -m hicache.stress --ops 2000 --seed 1 --only mla/direct --progress
    python -m hicache.stress --ops 5000 --faults 0.02 --device cuda --max-seconds 540
    python -m hicache.stress --ops 2000 --layers-pattern FSL --window 4 --checkpoint finish

After every op, what it changed is checked (slots, locks, sizes, bytes of new copies: see
``hicache.stress.tracker``); every ``--full-every`` ops and at the end of each scenario,
everything is (``check_invariants``, slot ownership from scratch, every cached token's bytes).
Prints one line per scenario (ops, time, ops/s, violations, what happened) and a total; exits 1
when any scenario found a violation, printing the op, seed and messages needed to replay it.
Progress (ops done, ops/s, violations) goes to stderr when it is a terminal, or with
``--progress``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import torch

from hicache.__main__ import HelpFormatter as DefaultsFormatter
from hicache.__main__ import OneLineParser, add_log_level, plain, setup_logging
from hicache.bench.model_flags import CHECKPOINT_FORMS, parse_checkpoint
from hicache.bench.progress import ProgressBar
from hicache.stress.config import StressConfig
from hicache.stress.runner import Report, matrix, run

log = logging.getLogger("hicache.stress")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultsFormatter):
    """The module docstring as written, and every option's default."""


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m hicache.stress",
        description=plain(__doc__ or ""),
        formatter_class=HelpFormatter,
    )
    p.add_argument("--ops", type=int, default=2000, help="random ops per scenario (>= 1)")
    p.add_argument("--seed", type=int, default=0, help="base seed; each scenario derives its own")
    p.add_argument("--page-sizes", type=int, nargs="+", default=[1, 64], help="page sizes to run")
    p.add_argument(
        "--full",
        action="store_true",
        help="every write policy for every route (else rotated across routes)",
    )
    p.add_argument(
        "--faults",
        type=float,
        default=0.0,
        help="rate in [0, 1) of injected faults (allocator short, transfer failing)",
    )
    p.add_argument(
        "--full-every",
        type=int,
        default=1000,
        help="ops between full checks (each op's changes are always checked)",
    )
    p.add_argument("--device", default="cpu", help="device pool device: cpu or cuda")
    p.add_argument(
        "--layers-pattern",
        default=None,
        help="a hybrid model (HybridHiRadixCache), one letter a layer: F full attention, "
        "S sliding window, L linear recurrence, e.g. FSL (default: full attention only)",
    )
    p.add_argument("--window", type=int, default=4, help="S layers' window in tokens")
    p.add_argument(
        "--checkpoint",
        type=parse_checkpoint,
        default="finish",
        help=f"where L layers' states are taken: {CHECKPOINT_FORMS}",
    )
    p.add_argument(
        "--only", default="", help="run scenarios whose label contains this (default: all)"
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="wall-clock budget, split evenly over the scenarios (each stops early; default: none)",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress on stderr (default: when stderr is a terminal)",
    )
    add_log_level(p)
    return p


def _bad_value(args: argparse.Namespace) -> str | None:
    """What is wrong with the numbers or the device, in ``argument --flag: ...`` form."""
    bounds = [
        ("--ops", args.ops, args.ops >= 1, ">= 1"),
        ("--full-every", args.full_every, args.full_every >= 1, ">= 1"),
        ("--faults", args.faults, 0 <= args.faults < 1, "in [0, 1)"),
        (
            "--max-seconds",
            args.max_seconds,
            args.max_seconds is None or args.max_seconds > 0,
            "> 0",
        ),
    ]
    for flag, value, ok, allowed in bounds:
        if not ok:
            return f"argument {flag}: must be {allowed}, got {value}"
    try:
        torch.device(args.device)
    except RuntimeError:
        return f"argument --device: not a device (e.g. cpu, cuda:0), got {args.device!r}"
    return None


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[StressConfig]]:
    """The arguments and the scenarios they select; a bad value exits 2 with one line."""
    p = build_parser()
    args = p.parse_args(argv)
    problem = _bad_value(args)
    if problem is not None:
        p.error(problem)
    try:
        base = StressConfig(
            ops=args.ops,
            seed=args.seed,
            p_alloc_none=args.faults,
            p_transfer_fail=args.faults,
            full_every=args.full_every,
            device=args.device,
            layers_pattern=args.layers_pattern,
            window=args.window,
            checkpoint=args.checkpoint,
        )
    except (TypeError, ValueError) as err:
        p.error(f"argument --layers-pattern/--window/--checkpoint: {err}")
    try:
        configs = [c for c in matrix(base, args.page_sizes, args.full) if args.only in c.label()]
    except (TypeError, ValueError) as err:
        p.error(f"argument --page-sizes: {err}")
    if not configs:
        p.error(f"argument --only: no scenario label contains {args.only!r}")
    return args, configs


def _scenario(cfg: StressConfig, share: float | None, bar_label: str | None) -> Report:
    """Run one scenario, with a progress bar on stderr when ``bar_label`` is given."""
    if bar_label is None:
        return run(cfg, share)
    bar = ProgressBar(cfg.ops, bar_label, width=20)

    def progress(done: int, violations: int) -> None:
        rate = done / max(time.perf_counter() - bar.start, 1e-9)
        bar.update(done - bar.done, f"{rate:.0f} ops/s violations={violations} {cfg.label()}")

    try:
        return run(cfg, share, progress)
    finally:
        bar.close()


def main(argv: list[str] | None = None) -> int:
    args, configs = parse(argv)
    setup_logging(args.log_level)
    # Every tensor here is tiny: torch's intra-op threads only add wake-up latency (on a loaded
    # 2-core machine, ~16 ms per parallel op, a 10x slowdown of the whole run).
    torch.set_num_threads(1)
    print(f"{len(configs)} scenarios, {args.ops} ops each", flush=True)
    show = sys.stderr.isatty() if args.progress is None else args.progress
    start, ops, failed = time.perf_counter(), 0, 0
    share = None if args.max_seconds is None else args.max_seconds / max(len(configs), 1)
    width = max((len(c.label()) for c in configs), default=0)
    for k, cfg in enumerate(configs, 1):
        log.info("scenario %d/%d: %s (seed %d)", k, len(configs), cfg.label(), cfg.seed)
        report = _scenario(cfg, share, f"{k}/{len(configs)}" if show else None)
        ops += report.ops
        print(report.line(width), flush=True)
        if report.violations:
            failed += 1
            print("\n".join("    " + v for v in report.violations[:20]), flush=True)
    seconds = time.perf_counter() - start
    print(
        f"TOTAL scenarios={len(configs)} ops={ops} time={seconds:.1f}s "
        f"ops/s={ops / max(seconds, 1e-9):.0f} violations={failed}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
