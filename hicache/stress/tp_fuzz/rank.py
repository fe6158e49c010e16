"""One rank of the TP fuzz: the stress driver over this rank's shard, step by step, checked.

Every rank builds the same stress scenario (its own pools: MHA ranks hold their heads, with
the oracle's values of those heads, so another rank's bytes show; MLA ranks the whole, equal
latent), draws the same op
stream and injects its scenario's faults only on the fault rank. A step is one op, then
``check_hicache_events`` (as a scheduler does once per step), then the checks: what the op
changed (the stress tracker: slots, locks, sizes, bytes), every ``full_every`` steps
everything (``check_invariants``, ownership from scratch, every cached byte), and last one
collective of the harness's own ``TPGroup`` (always agreeing, even when the caches' does not)
comparing the ranks' tree digests and whether any rank found a violation.

The rank returns a :class:`RankResult`; on a digest mismatch it also describes its tree
(:mod:`hicache.stress.tp_fuzz.diff`) so the parent can name the diverging nodes.
"""

from __future__ import annotations

import hashlib
import os
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from hicache.stress import oracle
from hicache.stress.driver import Driver
from hicache.stress.faults import STEP_FAULTS
from hicache.stress.tp_fuzz.diff import describe
from hicache.stress.tp_fuzz.ops import StorageOps, op_table
from hicache.stress.tp_fuzz.scenarios import STORAGE, FuzzConfig, install, make_faults
from hicache.tp.group import TPError, TPGroup, TPPeerError


@dataclass
class RankResult:
    """How one rank's run went.

    Attributes
    ----------
    rank : the rank; steps : steps completed; ops : ops that acted on the cache.
    injected : fault kind -> faults injected on this rank.
    violations : what the checks found (first messages only).
    diverged_at : the step whose digests differed across ranks (None: never).
    tp_error : the ``TPError`` (not a peer's step failure) that stopped the rank, if any.
    tp_error_wait_s : seconds from the last collective that succeeded to that error.
    peer_errors : steps another rank's fault stopped (``TPPeerError``).
    leaks : violations that report a leaked slot or lock.
    seconds : wall time of the steps; counts : what the driver did.
    tree : this rank's tree, described, when the digests differed.
    stats : this rank's ``cache.stats()`` as rows, when the digests differed.
    last_ops : the last steps' ops, with the faults each injected.
    collectives : the caches' and the harness's collectives.
    """

    rank: int
    steps: int = 0
    ops: int = 0
    injected: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    diverged_at: int | None = None
    tp_error: str | None = None
    tp_error_wait_s: float = 0.0
    peer_errors: int = 0
    leaks: int = 0
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    tree: list[str] = field(default_factory=list)
    stats: list[str] = field(default_factory=list)
    last_ops: list[str] = field(default_factory=list)
    collectives: int = 0


def _words(digest: bytes) -> list[int]:
    sha = hashlib.sha256(digest).digest()
    return [int.from_bytes(sha[i : i + 7], "little") for i in (0, 7)]


class RankRun:
    """The state of one rank's run (see the module docstring)."""

    def __init__(self, group: Any, cfg: FuzzConfig) -> None:
        self.cfg = cfg
        self.checks = TPGroup(group, timeout_s=cfg.timeout_s)
        self.rank = self.checks.rank
        oracle.set_shard(self.rank if cfg.kind == "mha" else 0)  # MLA: one latent, every rank
        tp = self.tp = TPGroup(group, timeout_s=cfg.timeout_s, agree=cfg.agree, debug=cfg.debug)
        self.faults = make_faults(cfg, self.rank)
        self.driver = Driver(cfg.stress_config(self.rank), tp_group=tp, faults=self.faults)
        install(cfg, self.faults, self.driver)
        self.storage = StorageOps(self.driver)
        self.ops = op_table(self.storage, cfg.scenario in STORAGE)
        self.result = RankResult(self.rank)
        self.last_ok = time.monotonic()
        self.history: list[str] = []

    def run(self) -> RankResult:
        names, start = list(self.ops), time.perf_counter()
        weights = [self.ops[n][0] for n in names]
        kill = self.cfg.kill_step() if self.cfg.scenario == "rank_killed" else -1
        try:
            for k in range(1, self.cfg.steps + 1):
                name = self.driver.rng.choices(names, weights)[0]
                if k == kill and self.rank == self.cfg.fault_rank:
                    os._exit(3)  # the fault: this rank dies mid-run, without a word
                if not self.step(k, name):
                    break
            else:
                self.finish()
        except TPError as err:  # the group broke: a rank died or stopped answering
            self.result.tp_error = f"{type(err).__name__}: {err}"
            self.result.tp_error_wait_s = time.monotonic() - self.last_ok
        self.result.seconds = time.perf_counter() - start
        return self.summary()

    def step(self, k: int, name: str) -> bool:
        """One step; False when the run must stop (every rank stops at the same step)."""
        d = self.driver
        d.counts[name] += 1
        before = dict(self.faults.injected)
        if not d.idle(name):
            self.result.ops += 1
            self.guarded(lambda: self.ops[name][1](d), name)
        self.guarded(d.cache.check_hicache_events, "check_hicache_events")
        fired = {
            f: n - before.get(f, 0) for f, n in self.faults.injected.items() if n > before.get(f, 0)
        }
        self.history = [*self.history[-7:], f"{k}:{name} {fired or ''}".strip()]
        self.checked(d.check)
        if k % self.cfg.full_every == 0 and not d.violations:
            self.checked(d.check_full)
        self.result.steps = k
        return self.agree_step(k)

    def guarded(self, call: Any, name: str) -> None:
        """Run a cache call: a fault (this rank's or a peer's) is expected, a ``TPError``
        ends the run, anything else is a violation."""
        try:
            call()
        except STEP_FAULTS as err:
            self.driver.counts[f"fault_surfaced_in_{name}"] += 1
            self.result.peer_errors += isinstance(err, TPPeerError)
        except TPError:
            raise
        except Exception as err:  # a crash of the cache under test
            self.driver.violations.append(
                f"{name} raised {type(err).__name__}: {err}\n" + traceback.format_exc(limit=-4)
            )

    def checked(self, check: Any) -> None:
        try:
            check()
        except TPError:
            raise
        except Exception as err:  # state too broken to read back
            self.driver.violations.append(f"checking it raised {type(err).__name__}: {err}")

    def agree_step(self, k: int) -> bool:
        """One harness collective: every rank's digest and whether it found a violation."""
        words = _words(self.driver.cache.tree_digest())
        ok = int(not self.driver.violations)
        low, high = self.checks.agree([ok, *words], words, where=f"fuzz step {k}")
        self.last_ok = time.monotonic()
        if low[1:] != high:
            self.result.diverged_at = k
            self.result.tree = describe(self.driver.cache)
            self.result.stats = _stat_rows(self.driver.cache.stats())
            self.result.last_ops = list(self.history)
            return False
        return bool(low[0])

    def finish(self) -> None:
        """Faults off, every prefetch aborted, every transfer landed; then check everything,
        and that the ranks still agree."""
        d = self.driver
        self.storage.abort_all()
        d.drain()
        d.cache.drain_transfers()
        d.cache.check_hicache_events()
        d.audit_locks()
        self.checked(d.check_full)
        self.agree_step(self.cfg.steps + 1)

    def summary(self) -> RankResult:
        r, d = self.result, self.driver
        r.injected = dict(self.faults.injected)
        r.violations = d.violations[:20]
        r.leaks = sum("leak" in v for v in d.violations)
        r.counts = dict(Counter(d.counts))
        r.collectives = self.tp.collectives + self.checks.collectives
        if r.last_ops == []:
            r.last_ops = list(self.history)
        return r


def _stat_rows(stats: Any) -> list[str]:
    """``cache.stats()`` as ``section.field=value`` rows (timings left out: rank-local)."""
    rows = []
    for section, fields in stats.as_dict().items():
        rows += [f"{section}.{k}={v}" for k, v in (fields or {}).items() if "seconds" not in k]
    return rows


def rank_main(group: Any, cfgs: tuple[FuzzConfig, ...]) -> list[RankResult]:
    """``launch_ranks`` entry: run each of ``cfgs`` in turn on this rank, a fresh cache each
    (``group`` None: one rank, no collectives)."""
    torch.set_num_threads(1)  # tiny tensors; more threads only add wake-ups on a busy box
    return [RankRun(group, cfg).run() for cfg in cfgs]
