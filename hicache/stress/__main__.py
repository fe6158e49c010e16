"""``python -m hicache.stress``: seeded random stress of HiRadixCache over a config matrix.

Examples::

    python -m hicache.stress --ops 2000 --seed 1
    python -m hicache.stress --ops 100000 --faults 0.02 --device cuda --max-seconds 540

Prints one line per scenario (ops, time, violations, what happened) and a total; exits 1 when
any scenario found a violation, printing the op, seed and messages needed to replay it.
"""

from __future__ import annotations

import argparse
import sys
import time

from hicache.stress.config import StressConfig
from hicache.stress.runner import matrix, run


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hicache.stress", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, default=2000, help="random ops per scenario")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--page-sizes", type=int, nargs="+", default=[1, 64])
    p.add_argument("--full", action="store_true",
                   help="every write policy for every route (else rotated across routes)")
    p.add_argument("--faults", type=float, default=0.0,
                   help="rate of injected faults (allocator short, transfer failing)")
    p.add_argument("--verify-every", type=int, default=50, help="byte sweep period in ops")
    p.add_argument("--device", default="cpu", help="device pool device: cpu or cuda")
    p.add_argument("--only", default="", help="run scenarios whose label contains this")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="wall-clock budget, split evenly over the scenarios (each stops early)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    base = StressConfig(ops=args.ops, seed=args.seed, p_alloc_none=args.faults,
                        p_transfer_fail=args.faults, verify_every=args.verify_every,
                        device=args.device)
    configs = [c for c in matrix(base, args.page_sizes, args.full) if args.only in c.label()]
    start, ops, failed = time.perf_counter(), 0, 0
    share = None if args.max_seconds is None else args.max_seconds / max(len(configs), 1)
    for cfg in configs:
        report = run(cfg, share)
        ops += report.ops
        print(report.line(), flush=True)
        if report.violations:
            failed += 1
            print("\n".join("    " + v for v in report.violations[:20]), flush=True)
    seconds = time.perf_counter() - start
    print(f"TOTAL scenarios={len(configs)} ops={ops} time={seconds:.1f}s "
          f"ops/s={ops / max(seconds, 1e-9):.0f} violations={failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
