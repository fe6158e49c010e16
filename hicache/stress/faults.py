"""Fault injection: allocators that come up short, transfers that fail part-way, storage
backends that raise or miss.

Every injector patches one bound method of one object (never a class), counts what it injected
and is undone by :meth:`Faults.restore`. Faults are drawn from a seeded ``random.Random``, so a
failing run replays exactly.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hicache.pools.load_plan import LayerRunner, LoadPlan
from hicache.tp import TPPeerError


class InjectedFault(RuntimeError):
    """Raised by an injected transfer failure (never by the code under test)."""


# What a driver step may raise after a fault: its own, or (under TP) another rank's.
STEP_FAULTS = (InjectedFault, TPPeerError)


@dataclass
class Faults:
    """Seeded fault injector over a set of objects.

    Parameters
    ----------
    rng : the source of every decision.
    p_alloc_none : probability that a patched ``alloc`` returns None instead of allocating.
    p_transfer_fail : probability that a patched transfer raises :class:`InjectedFault`.
    p_storage : probability that a patched storage call raises ``OSError`` (``batch_get_v1``
        may also report its pages missing instead).

    Attributes
    ----------
    injected : name -> how many faults of that kind fired.
    enabled : faults fire only while True (the checker turns them off to read state back).
    """

    rng: random.Random
    p_alloc_none: float = 0.0
    p_transfer_fail: float = 0.0
    p_storage: float = 0.0
    injected: dict[str, int] = field(default_factory=dict)
    enabled: bool = True
    _undo: list[tuple[Any, str]] = field(default_factory=list)

    def _patch(self, obj: Any, name: str, wrapper: Callable[..., Any]) -> None:
        self._undo.append((obj, name))
        setattr(obj, name, wrapper)

    def _fire(self, kind: str, p: float) -> bool:
        if not self.enabled or p <= 0 or self.rng.random() >= p:
            return False
        self.injected[kind] = self.injected.get(kind, 0) + 1
        return True

    def flaky_alloc(self, pool: Any, kind: str) -> None:
        """``pool.alloc(n)`` (and ``alloc_pair`` where the pool has it) returns None, allocating
        nothing, with probability ``p_alloc_none``."""
        for name in ("alloc", "alloc_pair"):
            if hasattr(pool, name):
                self._patch(pool, name, self._flaky(getattr(pool, name), kind))

    def _flaky(self, original: Any, kind: str) -> Any:
        def alloc(n: int) -> Any:
            return None if self._fire(kind, self.p_alloc_none) else original(n)

        return alloc

    def failing_load(self, host_pool: Any) -> None:
        """A load batch planned by ``host_pool.plan_load`` raises on a layer after earlier layers
        have landed."""
        original = host_pool.plan_load

        def plan_load(*args: Any) -> LoadPlan:
            plan = original(*args)
            fails = _FlakyLayers(plan.runner, lambda: self._fire("load_fail", self.p_transfer_fail))
            return dataclasses.replace(plan, runner=fails)

        self._patch(host_pool, "plan_load", plan_load)

    def failing_backup(self, host_pool: Any) -> None:
        """``backup_from_device_all_layer`` raises after copying (bytes landed, batch failed)."""
        original = host_pool.backup_from_device_all_layer

        def backup(device_pool: Any, host_idx: Any, dev_idx: Any, io: str, **kw: Any) -> None:
            original(device_pool, host_idx, dev_idx, io, **kw)  # ``staging`` on CUDA
            if self._fire("backup_fail", self.p_transfer_fail):
                raise InjectedFault("injected backup failure after the copy")

        self._patch(host_pool, "backup_from_device_all_layer", backup)

    def flaky_storage(self, backend: Any) -> None:
        """``backend``'s ``batch_exists`` / ``batch_get_v1`` / ``batch_set_v1`` raise
        ``OSError`` with probability ``p_storage``; a read that does not raise reports each
        page missing with the same probability."""
        for name in ("batch_exists", "batch_get_v1", "batch_set_v1"):
            self._patch(backend, name, self._flaky_call(getattr(backend, name), name))

    def _flaky_call(self, call: Callable[..., Any], name: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self._fire("storage_raise", self.p_storage):
                raise OSError(f"injected storage failure in {name}")
            out = call(*args, **kwargs)
            if name == "batch_get_v1":
                out = [ok and not self._fire("storage_miss", self.p_storage) for ok in out]
            return out

        return wrapper

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No faults fire inside the block (checkers read state back); restored on exit."""
        enabled, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = enabled

    def restore(self) -> None:
        """Undo every patch (most recent first)."""
        while self._undo:
            obj, name = self._undo.pop()
            delattr(obj, name)


class _FlakyLayers:
    """A load plan's layer runner that fails a layer past the first whenever ``fire()``."""

    def __init__(self, runner: LayerRunner, fire: Callable[[], bool]) -> None:
        self.runner, self.fire = runner, fire

    def run(self, layer_id: int) -> None:
        if layer_id > 0 and self.fire():
            raise InjectedFault(f"injected load failure at layer {layer_id}")
        self.runner.run(layer_id)
