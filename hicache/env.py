"""Every environment variable hicache reads, read in this one place.

Reading never fails, so a bad value cannot break ``import hicache``: a HICACHE_ variable that
cannot be parsed is kept as an :class:`Invalid`, and :func:`require` raises its ``ValueError``
(naming the variable) where the setting is used.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Invalid:
    """A setting whose environment variable held an unusable value; ``message`` says why."""

    message: str


def require(value: T | Invalid) -> T:
    """``value`` itself, or the ``ValueError`` of an :class:`Invalid` setting."""
    if isinstance(value, Invalid):
        raise ValueError(value.message)
    return value


def _triton_flag(name: str) -> bool:
    """Triton's own reading of its flags (anything unrecognised is off)."""
    return os.environ.get(name, "").strip().lower() in _TRUE


def _flag(name: str, default: bool) -> bool | Invalid:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE | _FALSE:
        return value in _TRUE
    return Invalid(f"{name}={raw!r} is not a flag: use one of 1/0, true/false, yes/no, on/off")


def _amount(name: str, default: float, unit: str) -> float | Invalid:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        return Invalid(f"{name}={raw!r} must be a finite, non-negative number of {unit}")
    return value


def _prefixed(prefix: str) -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted(
            (name[len(prefix) :].lower(), value)
            for name, value in os.environ.items()
            if name.startswith(prefix)
        )
    )


@dataclass(frozen=True)
class Env:
    """Process-wide settings; read a setting that may be :class:`Invalid` through ``require``.

    Attributes
    ----------
    triton_interpret : ``TRITON_INTERPRET`` — Triton kernels run in the CPU interpreter
        (parsed as Triton parses it).
    check_device_indices : ``HICACHE_CHECK_DEVICE_INDICES`` — range-check CUDA index tensors
        too (costs a device sync per op; CPU index tensors are always checked).
    host_ram_reserve_gb : ``HICACHE_HOST_RAM_RESERVE_GB`` — RAM (GB, finite, >= 0; default 2) a
        host pool must leave free.
    check_ownership : ``HICACHE_CHECK_OWNERSHIP`` — debug: slots handed to the radix tree must
        be allocated in the allocator (O(allocator) per call; see ``radix.ownership``).
    backup_staging_mb : ``HICACHE_BACKUP_STAGING_MB`` — MiB (finite, >= 0; 0: off; default
        256) of device memory a CUDA controller stages kernel-backend backups through
        (``hicache.pools.backup_staging``): on an H100 a device hit during a backup goes from
        1.27-1.28x an idle one without it to 1.05-1.06x with it (``benchmarks/RESULTS.md``).
    native_move_kv_cache : ``HICACHE_NATIVE_MOVE_KV_CACHE`` — device pools' ``move_kv_cache``
        uses torch indexing instead of the Triton kernel (SGLang's
        ``SGLANG_NATIVE_MOVE_KV_CACHE``).
    check_threads : ``HICACHE_CHECK_THREADS`` — debug: the cache, the allocators and the engine
        refuse a mutating call from a second thread (``hicache.threads``; about 0.16 us per
        guarded call). Read when those classes are defined; an unparsable value turns it on.
        The test suite turns it on.
    mooncake : ``HICACHE_MOONCAKE_*`` — the Mooncake Store backend's settings as raw
        ``(name, value)`` pairs, ``name`` the lower-cased rest (``HICACHE_MOONCAKE_PROTOCOL``
        -> ``protocol``); parsed by ``hicache.backends.mooncake_config``.
    """

    triton_interpret: bool
    check_device_indices: bool | Invalid
    host_ram_reserve_gb: float | Invalid
    check_ownership: bool | Invalid = False
    backup_staging_mb: float | Invalid = 256.0
    native_move_kv_cache: bool | Invalid = False
    check_threads: bool | Invalid = False
    mooncake: tuple[tuple[str, str], ...] = ()

    @classmethod
    def read(cls) -> Env:
        return cls(
            triton_interpret=_triton_flag("TRITON_INTERPRET"),
            check_device_indices=_flag("HICACHE_CHECK_DEVICE_INDICES", False),
            host_ram_reserve_gb=_amount("HICACHE_HOST_RAM_RESERVE_GB", 2.0, "GB"),
            backup_staging_mb=_amount("HICACHE_BACKUP_STAGING_MB", 256.0, "MiB"),
            check_ownership=_flag("HICACHE_CHECK_OWNERSHIP", False),
            native_move_kv_cache=_flag("HICACHE_NATIVE_MOVE_KV_CACHE", False),
            check_threads=_flag("HICACHE_CHECK_THREADS", False),
            mooncake=_prefixed("HICACHE_MOONCAKE_"),
        )


ENV = Env.read()


def device_indices_checked() -> bool:
    """Whether CUDA index tensors are range-checked (``HICACHE_CHECK_DEVICE_INDICES``)."""
    return require(ENV.check_device_indices)


def ownership_checked() -> bool:
    """Whether the radix tree checks slots against the allocator (``HICACHE_CHECK_OWNERSHIP``)."""
    return require(ENV.check_ownership)


def threads_checked() -> bool:
    """Whether the wrong-thread guard is on (``HICACHE_CHECK_THREADS``; unparsable: on)."""
    return ENV.check_threads is not False


def backup_staging_bytes() -> int:
    """Device bytes of a controller's backup staging buffer (``HICACHE_BACKUP_STAGING_MB``)."""
    return int(require(ENV.backup_staging_mb) * 2**20)


def native_move_kv_cache() -> bool:
    """Whether ``move_kv_cache`` takes the torch path (``HICACHE_NATIVE_MOVE_KV_CACHE``)."""
    return require(ENV.native_move_kv_cache)


def mooncake_settings() -> dict[str, str]:
    """The raw ``HICACHE_MOONCAKE_*`` settings by lower-cased name (see ``Env.mooncake``)."""
    return dict(ENV.mooncake)


def storage_dir() -> str | None:
    """``HICACHE_STORAGE_DIR``: the file storage backend's default root (None when unset or
    empty); read at each call, so a backend built later sees a change."""
    return os.environ.get("HICACHE_STORAGE_DIR") or None
