"""``python -m hicache.stress.tp_fuzz``: the ranks of a TP group drive their caches through one
seeded request stream while one rank suffers a rank-local fault; the trees must stay identical.

Examples::

    python -m hicache.stress.tp_fuzz --ranks 2 --steps 2000 --scenario host_alloc --seed 1
    python -m hicache.stress.tp_fuzz --ranks 4 --steps 500 --scenario all --kind mla
    python -m hicache.stress.tp_fuzz --ranks 2 --steps 500 --scenario all --no-agree  # diverges

Each rank is a process (``launch_ranks``, gloo over loopback) running
:mod:`hicache.stress.tp_fuzz.rank`: after every step its own checks (slots, locks, bytes against its
shard's oracle), and a collective comparing the ranks' tree digests. With agreement on, every
scenario must run clean (``rank_killed``: every surviving rank raises ``TPError``, no hang);
with ``--no-agree`` the rank-local scenarios must diverge. Prints a row per scenario and exits
1 when a row is not what its scenario expects.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass, field, replace

from hicache.stress.tp_fuzz.diff import diff_rows
from hicache.stress.tp_fuzz.rank import RankResult, rank_main
from hicache.stress.tp_fuzz.scenarios import KINDS, RANK_LOCAL, SCENARIOS, STORAGE, FuzzConfig
from hicache.tp.launch import RankOutcome, launch_ranks


@dataclass
class FuzzReport:
    """What one run did, over its ranks.

    Attributes
    ----------
    cfg : the run; outcome : ``clean``, ``diverged``, ``tp_error``, ``killed`` (rank_killed:
        the fault rank died and every other raised ``TPError`` in time), ``violations`` or
        ``crashed``; expected : whether ``outcome`` is what the scenario must give.
    steps : the steps every rank completed; ops : ops that acted (the first live rank's).
    faults : faults injected (all ranks); divergences : 1 when the digests differed.
    hangs : ranks stopped by the launch timeout, or whose ``TPError`` took the collective
        timeout (a peer that stopped answering); leaks, violations : over all ranks.
    seconds : wall time of the steps (the slowest rank; spawning not counted).
    collectives : collectives the first live rank issued (the caches' and the harness's).
    activity : what the first live rank's driver did (load-backs, prefetched tokens, faults
        surfaced as its own exception or a peer's).
    detail : messages (the ranks' first violations, the diverging rows, the errors).
    """

    cfg: FuzzConfig
    outcome: str = "clean"
    expected: bool = True
    steps: int = 0
    ops: int = 0
    faults: int = 0
    divergences: int = 0
    hangs: int = 0
    leaks: int = 0
    violations: int = 0
    seconds: float = 0.0
    collectives: int = 0
    activity: dict[str, int] = field(default_factory=dict)
    detail: list[str] = field(default_factory=list)

    def row(self) -> str:
        mark = "ok" if self.expected else "UNEXPECTED"
        per_step = self.collectives / max(self.steps, 1)
        return (
            f"{self.cfg.label():<44} {self.steps:>6} {self.ops:>6} {self.faults:>6} "
            f"{self.divergences:>4} {self.hangs:>5} {self.leaks:>5} {self.violations:>5} "
            f"{self.seconds:>7.1f} {per_step:>5.1f}  {self.outcome:<10} {mark}"
        )


HEADER = (
    f"{'scenario/kind/page/tp/agree':<44} {'steps':>6} {'ops':>6} {'faults':>6} "
    f"{'div':>4} {'hangs':>5} {'leaks':>5} {'viol':>5} {'wall_s':>7} {'coll':>5}  "
    f"{'outcome':<10} check"
)


def expected_outcome(cfg: FuzzConfig) -> tuple[str, ...]:
    """The outcomes a run of ``cfg`` may end in to pass."""
    if cfg.scenario == "rank_killed":
        return ("killed",)
    if not cfg.agree and cfg.scenario in RANK_LOCAL:
        return ("diverged", "tp_error")
    return ("clean",)


def run_fuzz(cfgs: list[FuzzConfig], launch_timeout_s: float | None = None) -> list[FuzzReport]:
    """Run ``cfgs`` one after the other in one launch of their ``ranks`` processes (one
    spawn for many runs); a report per run. ``rank_killed`` kills a process: it runs alone.
    The ranks of a run with a storage tier share a fresh file store (a temporary directory)."""
    ranks = {cfg.ranks for cfg in cfgs}
    if len(ranks) != 1:
        raise ValueError(f"cfgs must share one rank count, got {sorted(ranks)}")
    if len(cfgs) > 1 and any(cfg.scenario == "rank_killed" for cfg in cfgs):
        raise ValueError("cfgs: a rank_killed run must be launched alone")
    size = ranks.pop()
    limit = launch_timeout_s or 120.0 + sum(cfg.steps for cfg in cfgs) * 0.05 * size
    with tempfile.TemporaryDirectory(prefix="hicache-tp-fuzz-") as tmp:
        shared = [
            replace(c, storage_dir=f"{tmp}/{i}") if c.scenario in STORAGE else c
            for i, c in enumerate(cfgs)
        ]
        outcomes = launch_ranks(rank_main, size, tuple(shared), timeout_s=limit)
    return [
        summarize(
            cfg, [o if o.error is not None else RankOutcome(o.rank, o.result[i]) for o in outcomes]
        )
        for i, cfg in enumerate(cfgs)
    ]


def summarize(cfg: FuzzConfig, outcomes: list[RankOutcome]) -> FuzzReport:
    """Fold the ranks' outcomes into one report."""
    rep = FuzzReport(cfg)
    results: list[RankResult] = [o.result for o in outcomes if o.error is None]
    errors = [o for o in outcomes if o.error is not None]
    rep.hangs = sum(o.error == "killed" for o in errors)
    rep.hangs += sum(r.tp_error is not None and r.tp_error_wait_s >= cfg.timeout_s for r in results)
    rep.steps = min((r.steps for r in results), default=0)
    rep.ops = results[0].ops if results else 0
    rep.collectives = results[0].collectives if results else 0
    rep.activity = _activity(results[0]) if results else {}
    rep.faults = sum(sum(r.injected.values()) for r in results)
    rep.leaks = sum(r.leaks for r in results)
    rep.violations = sum(len(r.violations) for r in results)
    diverged = [r for r in results if r.diverged_at is not None]
    rep.divergences = int(bool(diverged))
    rep.outcome = _outcome(cfg, results, errors)
    rep.expected = rep.outcome in expected_outcome(cfg)
    rep.detail = _detail(results, errors, diverged)
    rep.seconds = max((r.seconds for r in results), default=0.0)
    return rep


ACTIVITY = ("admit", "load_back", "evicted", "host_evicted", "prefetch_loaded_tokens", "reset")


def _activity(r: RankResult) -> dict[str, int]:
    out = {k: r.counts.get(k, 0) for k in ACTIVITY}
    out["faults_surfaced"] = sum(v for k, v in r.counts.items() if k.startswith("fault_surf"))
    out["peer_errors"] = r.peer_errors
    return out


def _outcome(cfg: FuzzConfig, results: list[RankResult], errors: list[RankOutcome]) -> str:
    if cfg.scenario == "rank_killed" and [o.rank for o in errors] == [cfg.fault_rank]:
        survivors_stopped = all(
            r.tp_error is not None and r.tp_error_wait_s < cfg.timeout_s for r in results
        )
        if errors[0].error == "exited" and survivors_stopped:
            return "killed"
    if errors:
        return "crashed"
    if any(r.diverged_at is not None for r in results):
        return "diverged"
    if any(r.tp_error is not None for r in results):
        return "tp_error"
    return "violations" if any(r.violations for r in results) else "clean"


def _detail(
    results: list[RankResult], errors: list[RankOutcome], diverged: list[RankResult]
) -> list[str]:
    lines = [f"rank {o.rank}: {o.error} {o.detail[-1500:]}" for o in errors]
    for r in results:
        if r.violations:
            lines += [f"rank {r.rank} violation: {v}" for v in r.violations[:5]]
        if r.tp_error is not None:
            lines.append(
                f"rank {r.rank} after step {r.steps} ({r.tp_error_wait_s:.2f}s): {r.tp_error[:300]}"
            )
    if diverged:
        first = diverged[0]
        lines.append(f"digests differ after step {first.diverged_at}; last ops per rank:")
        lines += [f"  rank {r.rank}: {r.last_ops}" for r in diverged]
        lines += ["  stats " + row for row in diff_rows([r.stats for r in diverged])]
        lines += ["  node " + row for row in diff_rows([r.tree for r in diverged])]
    return lines


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hicache.stress.tp_fuzz", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--scenario", default="all", choices=("all", *SCENARIOS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fault-rank", type=int, default=None, help="default: the last rank")
    p.add_argument("--kind", default="mha", choices=KINDS)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--rate", type=float, default=0.1, help="probability of each fault")
    p.add_argument("--no-agree", action="store_true", help="caches' TPGroup(agree=False)")
    p.add_argument("--debug", action="store_true", help="caches' TPGroup(debug=True)")
    p.add_argument("--timeout", type=float, default=20.0, help="collective timeout, seconds")
    p.add_argument("--write-policy", default="write_through")
    p.add_argument("--eviction-policy", default="lru")
    p.add_argument("--tiering", default="inclusive", help="inclusive or exclusive")
    p.add_argument("--verbose", action="store_true", help="what each run did, under its row")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    base = FuzzConfig(
        ranks=a.ranks,
        steps=a.steps,
        seed=a.seed,
        fault_rank=a.ranks - 1 if a.fault_rank is None else a.fault_rank,
        kind=a.kind,
        page_size=a.page_size,
        rate=a.rate,
        agree=not a.no_agree,
        debug=a.debug,
        timeout_s=a.timeout,
        write_policy=a.write_policy,
        eviction_policy=a.eviction_policy,
        tiering=a.tiering,
    )
    names = SCENARIOS if a.scenario == "all" else (a.scenario,)
    batches = [[replace(base, scenario=n) for n in names if n != "rank_killed"]]
    batches += [[replace(base, scenario="rank_killed")]] if "rank_killed" in names else []
    reports, start = [], time.perf_counter()
    for batch in filter(None, batches):
        for rep in run_fuzz(batch):
            reports.append(rep)
            print(rep.row(), flush=True)
            if a.verbose:
                print("    " + " ".join(f"{k}={v}" for k, v in rep.activity.items()))
            if not rep.expected:
                print("\n".join("    " + line for line in rep.detail[:40]), flush=True)
    print(f"(launches and checks: {time.perf_counter() - start:.1f}s wall)")
    print(HEADER)
    print("\n".join(rep.row() for rep in reports))
    return 0 if all(rep.expected for rep in reports) else 1
