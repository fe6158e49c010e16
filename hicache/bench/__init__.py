"""The ``hicache bench`` main job: a multi-turn chat workload, device-only vs host tier, or
cold vs warm from the storage tier (``--storage``)."""

from hicache.bench.config import BenchConfig
from hicache.bench.runner import run_bench
from hicache.bench.storage_run import run_storage_bench

__all__ = ["BenchConfig", "run_bench", "run_storage_bench"]
