"""Where a prefill step with a host hit spends its CPU: ``cProfile`` over the engine's steps.

The step of ``bench_control_plane.py`` (TP 1) on ``--device``: one request whose 1,024-token
prefix is a host-only hit, finished in the step. Profiles only ``engine.step()`` (the model's
forward included: its rows show as the model's), then prints the functions with the most own
time and the most time below them, in microseconds per step. cProfile adds ~1 us per call, so
read the shares, not the absolute figures; ``step_calls.py`` counts the calls.

    python benchmarks/probes/step_profile.py [--device cuda] [--steps 100] [--rows 30]
        [--callers 'pin_memory|torch.cat'] [--callees issue_write]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from host_hit import engine_on, run_steps  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--callers", default="", help="regex: also print these functions' callers")
    parser.add_argument("--callees", default="", help="regex: also print these functions' callees")
    a = parser.parse_args()
    engine = engine_on(a.device, a.steps)
    profile = cProfile.Profile()
    run_steps(engine, a.steps, lambda on: profile.enable() if on else profile.disable())
    stats = pstats.Stats(profile)
    rows = stats.stats  # type: ignore[attr-defined]
    for title, col in (("own time", 2), ("time below", 3)):
        print(f"--- most {title}, us per step ({a.device})")
        top = sorted(rows.items(), key=lambda kv: kv[1][col], reverse=True)[: a.rows]
        for (file, line, name), v in top:
            where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else file
            print(f"{1e6 * v[col] / a.steps:9.1f} {v[1] / a.steps:7.1f} calls  {name}  {where}")
    for title, pattern in (("callers", a.callers), ("callees", a.callees)):
        if pattern:
            print(f"--- {title} of /{pattern}/, us per step: own time, time below")
            for line in links(rows, re.compile(pattern), title == "callers", a.steps):
                print(line)


def _name(func: tuple[str, int, str]) -> str:
    file, line, name = func
    return f"{name} {Path(file).name}:{line}" if line else name


def links(rows: dict, pattern: re.Pattern[str], callers: bool, steps: int) -> list[str]:
    """For each profiled function matching ``pattern``: its callers (or callees), with the
    time spent in it from (or below it in) each, in us per step."""
    out = []
    for func, (_cc, _nc, _tt, ct, by) in rows.items():
        if not pattern.search(_name(func)):
            continue
        out.append(f"{1e6 * ct / steps:9.1f}  {_name(func)}")
        edges = (
            by.items() if callers else [(f, r[4][func]) for f, r in rows.items() if func in r[4]]
        )
        for other, (_c, n, tt, ct2) in sorted(edges, key=lambda e: -e[1][3]):
            us = f"{1e6 * tt / steps:9.1f} {1e6 * ct2 / steps:9.1f}"
            out.append(f"    {us} {n / steps:6.1f}x  {_name(other)}")
    return out


if __name__ == "__main__":
    main()
