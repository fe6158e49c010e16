"""The ``hicache bench`` main job: a multi-turn chat workload, device-only vs host tier."""

from hicache.bench.config import BenchConfig
from hicache.bench.runner import run_bench

__all__ = ["BenchConfig", "run_bench"]
