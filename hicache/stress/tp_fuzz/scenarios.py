"""What one TP fuzz run is: its settings (:class:`FuzzConfig`) and its scenarios' faults.

A scenario names the rank-local fault injected on one rank (``fault_rank``): ``none``,
``host_alloc`` (host allocations return None), ``device_alloc`` (device allocations, the
cache's and the driver's, return None), ``slow_transfer`` (write and load acks finish a few
polls later), ``failing_transfer`` (loads and writes raise part-way), ``storage_errors`` (the
rank's storage backend raises or misses; every rank has a storage tier), ``rank_killed``
(the fault rank exits at a seeded step: the others must raise ``TPError``, not hang) and
``mixed`` (every fault above but the kill, at once, on the fault rank).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from hicache.backends import StorageConfig
from hicache.radix import HiCacheConfig
from hicache.stress.config import HOST_TIER, KINDS, StressConfig
from hicache.stress.driver import Driver
from hicache.stress.tp_fuzz.faults import TPFaults

SCENARIOS = (
    "none",
    "host_alloc",
    "device_alloc",
    "slow_transfer",
    "failing_transfer",
    "storage_errors",
    "rank_killed",
    "mixed",
)
# Scenarios whose fault makes the ranks diverge when agreement is off.
RANK_LOCAL = (*SCENARIOS[1:6], "mixed")
STORAGE = ("storage_errors", "mixed")  # the scenarios with a storage tier


@dataclass(frozen=True)
class FuzzConfig:
    """One TP fuzz run.

    Attributes
    ----------
    ranks : TP ranks (processes); scenario : one of :data:`SCENARIOS`.
    steps : steps per rank (an op, ``check_hicache_events``, the checks); seed : the op
        stream's seed (the same on every rank; faults draw from their own rngs).
    fault_rank : the rank the fault is injected on.
    kind : ``mha`` (each rank holds its heads) or ``mla`` (each rank the whole latent).
    page_size : tokens per page; rate : probability of each injected fault.
    agree : False builds the caches' ``TPGroup`` with ``agree=False`` (the switch-off proof).
    debug : the caches' ``TPGroup`` compares digests in every ``check_hicache_events`` too.
    timeout_s : bound on every collective; full_every : steps between full checks.
    write_policy, eviction_policy, tiering : the host tier's, the tree's, the host tier's
        (``HiCacheConfig.tiering``).
    storage_dir : ``storage_errors``: the directory of a ``file`` backend every rank shares
        (as ranks share a real store: MLA's non-writing ranks read what rank 0 wrote); empty:
        a ``memory`` backend per rank.
    storage_tiering : the storage tier's ``StorageConfig.tiering`` (host<->storage).
    """

    ranks: int = 2
    scenario: str = "none"
    steps: int = 200
    seed: int = 0
    fault_rank: int = 1
    kind: str = "mha"
    page_size: int = 1
    rate: float = 0.1
    agree: bool = True
    debug: bool = False
    timeout_s: float = 20.0
    full_every: int = 50
    write_policy: str = "write_through"
    eviction_policy: str = "lru"
    storage_dir: str = ""
    storage_tiering: str = "inclusive"
    tiering: str = "inclusive"

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"scenario must be one of {SCENARIOS}, got {self.scenario!r}")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        for name in ("ranks", "steps", "page_size", "full_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an int >= 1, got {getattr(self, name)!r}")
        if not 0 <= self.fault_rank < self.ranks:
            raise ValueError(f"fault_rank must be in [0, {self.ranks}), got {self.fault_rank}")
        if not 0.0 <= self.rate < 1.0:
            raise ValueError(f"rate must be in [0, 1), got {self.rate}")

    def label(self) -> str:
        agree = "on" if self.agree else "off"
        tiering = "/exclusive" if self.tiering == "exclusive" else ""
        l3 = "" if self.storage_tiering == "inclusive" else f"/l3-{self.storage_tiering}"
        return (
            f"{self.scenario}/{self.kind}/p{self.page_size}/tp{self.ranks}/agree-{agree}"
            f"{tiering}{l3}"
        )

    def kill_step(self) -> int:
        """The step at which ``rank_killed``'s fault rank exits (seeded, in the middle half)."""
        rng = random.Random(f"kill {self.seed}")
        return rng.randrange(self.steps // 4, max(3 * self.steps // 4, self.steps // 4 + 1))

    def stress_config(self, rank: int) -> StressConfig:
        """The stress scenario rank ``rank`` runs (the same on every rank but for storage's
        ``tp_rank``)."""
        host: HiCacheConfig = replace(
            HOST_TIER, write_policy=self.write_policy, tiering=self.tiering
        )
        if self.scenario in STORAGE:
            shared = {"root": self.storage_dir, "max_bytes": 1 << 26}
            storage = StorageConfig(
                backend="file" if self.storage_dir else "memory",
                extra_config=shared if self.storage_dir else {},
                tp_rank=rank,
                tp_size=self.ranks,
                prefetch_threshold=self.page_size,
                prefetch_timeout_base=0.002,
                prefetch_timeout_per_ki_token=0.0,
                query_batch_pages=4,
                io_batch_pages=4,
                tiering=self.storage_tiering,
            )
            host = replace(host, storage=storage)
        return StressConfig(
            kind=self.kind,
            page_size=self.page_size,
            hicache=host,
            ops=self.steps,
            seed=self.seed,
            full_every=self.full_every,
            eviction_policy=self.eviction_policy,
        )


def make_faults(cfg: FuzzConfig, rank: int) -> TPFaults:
    """Rank ``rank``'s injector: the scenario's rates on the fault rank, none elsewhere; its
    rng is its own (seeded from the seed and the rank), never the op stream's."""
    p, s = cfg.rate if rank == cfg.fault_rank else 0.0, _faults_of(cfg)
    return TPFaults(
        random.Random(f"faults {cfg.seed} {rank}"),
        p_alloc_none=p if s & {"host_alloc", "device_alloc"} else 0.0,
        p_transfer_fail=p if "failing_transfer" in s else 0.0,
        p_slow=3 * p if "slow_transfer" in s else 0.0,
        p_storage=p if "storage_errors" in s else 0.0,
    )


def _faults_of(cfg: FuzzConfig) -> set[str]:
    return set(RANK_LOCAL[:-1]) if cfg.scenario == "mixed" else {cfg.scenario}


def install(cfg: FuzzConfig, faults: TPFaults, driver: Driver) -> None:
    """Install the scenario's injectors over ``driver``'s pools, controller and storage."""
    s, host = _faults_of(cfg), driver.host_pool
    if "host_alloc" in s:
        faults.flaky_alloc(host, "host_alloc_none")
    if "device_alloc" in s:
        faults.flaky_alloc(driver.stack.allocator, "device_alloc_none")
    if "slow_transfer" in s:
        faults.slow_acks(driver.cache.cache_controller)
    if "failing_transfer" in s:
        faults.failing_load(host)
        faults.failing_backup(host)
    if "storage_errors" in s:
        storage = driver.cache.storage_tier
        assert storage is not None, "storage_errors runs with a storage tier"
        faults.flaky_storage(storage.storage.backend)
