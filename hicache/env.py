"""Every environment variable hicache reads, read in this one place."""

from __future__ import annotations

import os
from dataclasses import dataclass


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class Env:
    """Process-wide settings.

    Attributes
    ----------
    triton_interpret : ``TRITON_INTERPRET`` — Triton kernels run in the CPU interpreter.
    check_device_indices : ``HICACHE_CHECK_DEVICE_INDICES`` — range-check CUDA index tensors
        too (costs a device sync per op; CPU index tensors are always checked).
    host_ram_reserve_gb : ``HICACHE_HOST_RAM_RESERVE_GB`` — RAM a host pool must leave free.
    check_ownership : ``HICACHE_CHECK_OWNERSHIP`` — debug: check that slots handed to the radix
        tree are allocated and owned by no node (O(tree) per insert; see ``radix.ownership``).
    """

    triton_interpret: bool
    check_device_indices: bool
    host_ram_reserve_gb: float
    check_ownership: bool = False

    @classmethod
    def read(cls) -> Env:
        return cls(
            triton_interpret=_flag("TRITON_INTERPRET", False),
            check_device_indices=_flag("HICACHE_CHECK_DEVICE_INDICES", False),
            host_ram_reserve_gb=float(os.environ.get("HICACHE_HOST_RAM_RESERVE_GB", "2")),
            check_ownership=_flag("HICACHE_CHECK_OWNERSHIP", False),
        )


ENV = Env.read()
