"""Run stress scenarios: the op mix, one scenario end to end, and the config matrix."""

from __future__ import annotations

import itertools
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from operator import methodcaller

from hicache.controller import TIERINGS, WRITE_POLICIES
from hicache.pools import ROUTES
from hicache.stress.config import StressConfig
from hicache.stress.driver import Driver
from hicache.stress.faults import STEP_FAULTS
from hicache.stress.hybrid_driver import HybridDriver

# name -> (weight, op: the driver's method of that name). Requests dominate; resets are rare
# but every long run sees many.
OPS: dict[str, tuple[float, Callable[[Driver], object]]] = {
    "admit": (5, methodcaller("admit")),
    "advance": (6, methodcaller("advance")),
    "abort": (1, methodcaller("abort")),
    "peek": (2, methodcaller("peek")),
    "lock": (1, methodcaller("lock")),
    "unlock": (1, methodcaller("unlock")),
    "evict": (1, methodcaller("evict")),
    "evict_host": (1, methodcaller("evict_host")),
    "events": (3, methodcaller("events")),
    "reset": (0.05, methodcaller("reset")),
}
# A hybrid model's run adds its components' own evictions.
HYBRID_OPS: dict[str, tuple[float, Callable[[Driver], object]]] = {
    **OPS,
    "evict_swa": (1, methodcaller("evict_swa")),
    "evict_states": (1, methodcaller("evict_states")),
}
# With a storage tier it also polls the turns waiting on a prefetch (``hybrid_storage``).
STORAGE_OPS: dict[str, tuple[float, Callable[[Driver], object]]] = {
    **HYBRID_OPS,
    "prefetch_progress": (3, methodcaller("prefetch_progress")),
}


@dataclass
class Report:
    """What one scenario did: ``violations`` is empty when the cache held every invariant.
    ``seconds`` is wall-clock time, ``cpu_seconds`` the process's CPU time (a shared machine's
    wall time varies with its load)."""

    label: str
    ops: int
    seconds: float
    violations: list[str]
    counts: Counter[str] = field(default_factory=Counter)
    injected: dict[str, int] = field(default_factory=dict)
    cpu_seconds: float = 0.0

    @property
    def ops_per_second(self) -> float:
        return self.ops / max(self.seconds, 1e-9)

    def line(self, label_width: int = 48) -> str:
        """One table row; ``label_width``: the label column (the longest label of the table)."""
        keys = ("admit", "finished", "aborted", "load_back", "evicted", "host_evicted", "reset")
        shown = " ".join(f"{k}={self.counts.get(k, 0)}" for k in keys)
        faults = sum(self.injected.values())
        cpu = self.ops / max(self.cpu_seconds, 1e-9)
        return (
            f"{self.label:<{label_width}} ops={self.ops:<7} time={self.seconds:7.2f}s "
            f"ops/s={self.ops_per_second:<5.0f} (cpu {cpu:.0f}) "
            f"violations={len(self.violations)} faults={faults} {shown}"
        )


Progress = Callable[[int, int], None]  # (ops done, violations so far)
PROGRESS_EVERY = 100  # ops between progress callbacks


def step(driver: Driver, name: str) -> None:
    """One op, then the check of what it changed; a crash of either is a violation. An idle
    op (nothing to act on) changes nothing and is not run."""
    if driver.idle(name):
        return
    try:
        STORAGE_OPS[name][1](driver)
    except STEP_FAULTS:
        driver.counts[f"fault_surfaced_in_{name}"] += 1
    except Exception as err:  # a crash of the cache under test is a violation too
        driver.violations.append(
            f"raised {type(err).__name__}: {err}\n" + traceback.format_exc(limit=-4)
        )
    _checked(driver, driver.check)


def _checked(driver: Driver, check: Callable[[], None]) -> None:
    try:
        check()
    except Exception as err:  # state too broken to read back
        driver.violations.append(f"checking it raised {type(err).__name__}: {err}")


def run(
    cfg: StressConfig, seconds: float | None = None, progress: Progress | None = None
) -> Report:
    """Run ``cfg.ops`` random ops (or fewer when ``seconds`` run out), checking what each
    changed after it and everything every ``cfg.full_every`` ops and at the end; stop at the
    first violation. ``progress`` is called every :data:`PROGRESS_EVERY` ops and at the end."""
    driver = Driver(cfg) if cfg.layers_pattern is None else HybridDriver(cfg)
    ops = _ops(cfg)
    names = list(ops)
    weights = [ops[n][0] for n in names]
    start, cpu, done = time.perf_counter(), time.process_time(), 0
    deadline = None if seconds is None else start + seconds
    while done < cfg.ops and (deadline is None or time.perf_counter() < deadline):
        done += 1
        name = driver.rng.choices(names, weights)[0]
        driver.counts[name] += 1
        step(driver, name)
        where = f"op {done} ({name}), seed {cfg.seed}:"
        if not driver.violations and done % cfg.full_every == 0:
            _checked(driver, driver.check_full)
            where = f"full check after op {done}, seed {cfg.seed}:"
        if driver.violations:
            driver.violations.insert(0, where)
            break
        if progress is not None and done % PROGRESS_EVERY == 0:
            progress(done, 0)
    if not driver.violations:
        driver.drain()
        driver.audit_locks()
        _checked(driver, driver.check_full)
        if driver.violations:
            driver.violations.insert(0, f"final check after op {done}, seed {cfg.seed}:")
    driver.cache.close()  # a storage tier's threads
    if progress is not None:
        progress(done, len(driver.violations))
    return Report(
        cfg.label(),
        done,
        time.perf_counter() - start,
        driver.violations,
        driver.counts,
        dict(driver.faults.injected),
        time.process_time() - cpu,
    )


def _ops(cfg: StressConfig) -> dict[str, tuple[float, Callable[[Driver], object]]]:
    """The op mix of ``cfg``: plain, hybrid, or hybrid with a storage tier."""
    if cfg.layers_pattern is None:
        return OPS
    return HYBRID_OPS if cfg.hicache.storage is None else STORAGE_OPS


# (write policy, eviction policy) pairs: mru evicts the just-matched path first, the order
# that catches a load-back whose own nodes are not protected from eviction.
POLICY_PAIRS = list(itertools.product(WRITE_POLICIES, ("lru", "mru")))
# Exclusive runs alternate a host smaller than the device with the base's larger one.
EXCLUSIVE_RATIOS = (0.75, 3.0)


def matrix(
    base: StressConfig, page_sizes: Iterable[int] = (1, 64), full: bool = False
) -> list[StressConfig]:
    """Every route x page size, with every policy pair (``full``) or one, rotated; the
    tiering alternates (every pair meets both; a hybrid ``base`` is inclusive only), exclusive
    runs alternate host sizes."""
    configs = []
    tierings = TIERINGS if base.layers_pattern is None else ("inclusive",)
    for i, ((kind, backend, layout), page) in enumerate(itertools.product(ROUTES, page_sizes)):
        pairs = POLICY_PAIRS if full else [POLICY_PAIRS[i % len(POLICY_PAIRS)]]
        for j, (write, evict) in enumerate(pairs):
            host = replace(
                base.hicache,
                io_backend=backend,
                mem_layout=layout,
                write_policy=write,
                tiering=tierings[(i // len(POLICY_PAIRS) + j) % len(tierings)],
            )
            if host.tiering == "exclusive":
                host = replace(host, hicache_ratio=EXCLUSIVE_RATIOS[i % len(EXCLUSIVE_RATIOS)])
            seed = base.seed + 1000 * i + j
            configs.append(
                base.with_(
                    kind=kind, page_size=page, eviction_policy=evict, seed=seed, hicache=host
                )
            )
    return configs
