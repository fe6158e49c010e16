"""Recurrent states in a replay of a hybrid model: how many the tree holds (now and at peak, on
the device and on the host), how many it took and loaded back, and their bytes.

Counts are the cache's (``stats().components`` / ``.host_components``); bytes are counts x
``state_bytes``, one state of the modelled model. State memory sits beside the KV pool's: the
KV pool is ``device_tokens`` slots whatever the state pool's size, as SGLang sizes a hybrid
model's two pools apart, so an operator sizing a GPU adds ``state_slots x state_bytes`` (the
state pool, rows' own states included) to the KV bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hicache.radix.component_ledger import ComponentStats, HostComponentStats


def _counts(cache: Any) -> tuple[ComponentStats, HostComponentStats | None]:
    host = getattr(cache, "host_components", None)
    return cache.components.stats(), None if host is None else host.stats()


class StateTracker:
    """Samples a hybrid cache's state counts after each replay step (``sample``): the peaks,
    and the states loaded from the host since the last ``take_loaded``."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.device_peak = self.host_peak = self._loaded = 0

    def sample(self) -> None:
        device, host = _counts(self.cache)
        self.device_peak = max(self.device_peak, device.states_held)
        if host is not None:
            self.host_peak = max(self.host_peak, host.host_states_held)

    def take_loaded(self) -> int:
        """States copied from the host to the device since the last call (the cost model
        charges their bytes with the load-back they came with)."""
        _, host = _counts(self.cache)
        loaded = 0 if host is None else host.states_loaded
        new, self._loaded = loaded - self._loaded, loaded
        return new

    def figures(self, state_bytes: int, device_slots: int) -> StateFigures:
        self.sample()
        device, host = _counts(self.cache)
        return StateFigures(
            state_bytes,
            device_slots,
            device,
            host,
            self.device_peak,
            self.host_peak,
        )


@dataclass(frozen=True)
class StateFigures:
    """A replay's states: ``state_bytes`` each, ``device_slots`` in the device state pool;
    the cache's counters at the end and the peaks of states held."""

    state_bytes: int
    device_slots: int
    device: ComponentStats
    host: HostComponentStats | None
    device_peak: int
    host_peak: int

    def to_dict(self) -> dict[str, Any]:
        b, host = self.state_bytes, self.host
        held = 0 if host is None else host.host_states_held
        return {
            "state_bytes": b,
            "checkpoints": self.device.states_stored,
            "state_hits": self.device.state_hits,
            "device": {
                "slots": self.device_slots,
                "pool_bytes": self.device_slots * b,
                "held_end": self.device.states_held,
                "held_peak": self.device_peak,
                "peak_bytes": self.device_peak * b,
                "evicted": self.device.states_evicted,
            },
            "host": {
                "slots": 0 if host is None else host.host_state_capacity,
                "held_end": held,
                "held_peak": self.host_peak,
                "peak_bytes": self.host_peak * b,
                "backed_up": 0 if host is None else host.states_backed_up,
                "evicted": 0 if host is None else host.host_states_evicted,
            },
            "loaded": 0 if host is None else host.states_loaded,
            "loaded_bytes": (0 if host is None else host.states_loaded) * b,
        }


def format_states(s: dict[str, Any] | None, kv_device_bytes: int, kv_host_bytes: int) -> list[str]:
    """The report's state lines (none without states); ``kv_*_bytes``: the KV pools', beside."""
    if s is None:
        return []
    d, h, gb = s["device"], s["host"], 1e9
    return [
        f"  states        {s['checkpoints']:,} checkpoints taken, {s['state_hits']:,} matches "
        f"ended at one; {s['state_bytes']:,} B each",
        f"                device: {d['held_end']:,} held at the end, {d['held_peak']:,} at peak "
        f"= {d['peak_bytes'] / gb:,.2f} GB (KV pool {kv_device_bytes / gb:.3g} GB; state pool "
        f"{d['slots']:,} slots = {d['pool_bytes'] / gb:,.2f} GB beside it), {d['evicted']:,} "
        "evicted",
        f"                host: {h['held_end']:,} held at the end, {h['held_peak']:,} at peak "
        f"= {h['peak_bytes'] / gb:,.2f} GB (KV {kv_host_bytes / gb:.3g} GB), "
        f"{h['backed_up']:,} backed up, {s['loaded']:,} loaded back = "
        f"{s['loaded_bytes'] / gb:,.2f} GB",
    ]
