"""A hybrid model's HybridHiRadixCache under seeded random stress (``layers_pattern``), with
faults, and bugs planted in its components that the hybrid oracle must find."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import hicache.engine.hybrid as engine_hybrid
from hicache.pools import MambaPool, MambaPoolHost
from hicache.radix import CheckpointPolicy
from hicache.radix.component_ledger import ComponentLedger
from hicache.stress import checker, runner
from hicache.stress.__main__ import main
from hicache.stress.config import HOST_TIER, StressConfig
from hicache.stress.hybrid_storage import storage_tier
from hicache.stress.runner import matrix, run
from hicache.tiers.storage.state_storage import StateStorage

BASE = StressConfig(ops=300, full_every=60, seed=5)
SCENARIOS = [
    BASE.with_(layers_pattern="FSL", page_size=1),
    BASE.with_(layers_pattern="FSL", page_size=8, kind="mla"),
    BASE.with_(layers_pattern="FS", page_size=1, kind="mla", eviction_policy="mru"),
    BASE.with_(layers_pattern="FL", page_size=8),
    BASE.with_(layers_pattern="FFSL", page_size=4, checkpoint=CheckpointPolicy(True, 8, True)),
]
FAULTY = [c.with_(p_alloc_none=0.1, p_transfer_fail=0.1, seed=c.seed + 1) for c in SCENARIOS[:3]]
# A storage tier (a memory store): turns wait on prefetches, the store fails now and then.
L3 = BASE.with_(hicache=replace(HOST_TIER, storage=storage_tier()), ops=400)
STORAGE = [
    L3.with_(layers_pattern="FSL", page_size=1),
    L3.with_(layers_pattern="FL", page_size=8, p_storage_error=0.1, p_transfer_fail=0.05),
    L3.with_(layers_pattern="FSL", page_size=4, kind="mla", p_storage_error=0.1),
    L3.with_(layers_pattern="FS", page_size=4, p_alloc_none=0.05),
]
SLOW = [
    c.with_(ops=1000, full_every=250)
    for pattern in ("FSL", "SFL", "FL")
    for c in matrix(BASE.with_(layers_pattern=pattern, seed=31), (1, 16))
] + [
    c.with_(ops=1000, full_every=250)
    for c in matrix(L3.with_(layers_pattern="FSL", p_storage_error=0.05, seed=41), (1, 16))
]


def _clean(cfg: StressConfig) -> runner.Report:
    report = run(cfg)
    assert not report.violations, "\n".join(report.violations[:10])
    return report


@pytest.mark.parametrize("cfg", SCENARIOS + FAULTY, ids=lambda c: c.label())
def test_hybrid_scenario_keeps_every_invariant_byte_and_state(cfg: StressConfig) -> None:
    report = _clean(cfg)
    assert report.counts["finished"] and report.counts["evicted"], report.counts
    if cfg.p_transfer_fail:
        assert sum(report.injected.values()), report.injected


def test_the_hybrid_runs_reach_host_loads_tombstones_and_state_evictions() -> None:
    counts = sum((run(c).counts for c in SCENARIOS), start=runner.Counter())
    for what in ("load_back", "swa_evicted", "states_evicted", "host_evicted", "tracked"):
        assert counts[what] > 0, (what, counts)


def test_hybrid_storage_runs_keep_every_invariant_and_serve_from_storage() -> None:
    """Every prefix served after a prefetch passed ``check_served`` (full KV, SWA window,
    state) and every adopted host copy the sweep; storage did serve some, under faults."""
    counts, injected = runner.Counter[str](), runner.Counter[str]()
    for cfg in STORAGE:
        report = _clean(cfg)
        counts.update(report.counts)
        injected.update(report.injected)
    for what in ("prefetch_loaded_tokens", "storage_served", "prefetch_aborted", "finished"):
        assert counts[what] > 0, (what, counts)
    assert injected["storage_raise"] > 0, injected


def test_a_file_store_serves_a_warm_restart(tmp_path: Path) -> None:
    """A second cache over the first one's file store (the same workload) reads its pages."""
    store = replace(HOST_TIER, storage=storage_tier("file", str(tmp_path), "timeout"))
    loaded = 0
    for pattern in ("FS", "FSL", "FS"):
        report = _clean(L3.with_(layers_pattern=pattern, page_size=4, hicache=store, ops=200))
        loaded += report.counts["prefetch_loaded_tokens"]
    assert loaded > 0 and any(tmp_path.iterdir())


def test_slots_kept_for_a_pending_write_are_owned_not_leaked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A revived node's old slots stay allocated while its write stays queued (its issue
    failed) over several ops and full checks: counted as owned, not leaked; the end's drain
    lands the write and frees them (the final full check)."""
    seen: list[int] = []
    ownership = checker.ownership

    def counting(cache: Any, *args: Any) -> list[str]:
        seen.append(cache.host_tier.held().numel())
        return ownership(cache, *args)

    monkeypatch.setattr(checker, "ownership", counting)
    cfg = BASE.with_(layers_pattern="FS", page_size=16, ops=160, full_every=1, seed=707)
    host = replace(cfg.hicache, io_backend="direct", write_policy="write_through_selective")
    _clean(cfg.with_(hicache=host, eviction_policy="mru", p_transfer_fail=0.3))
    assert max(seen) > 0 and seen[-1] == 0


@pytest.mark.slow
@pytest.mark.parametrize("cfg", SLOW, ids=lambda c: c.label())
def test_hybrid_matrix_long(cfg: StressConfig) -> None:
    _clean(cfg)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"layers_pattern": "FX"}, "layers_pattern must use only"),
        ({"layers_pattern": "SL"}, "with an F"),
        ({"layers_pattern": "FF"}, "an S or L"),
        ({"layers_pattern": "FS", "window": 0}, "window must be"),
        ({"layers_pattern": "FL", "checkpoint": "finish"}, "checkpoint must be"),
        ({"layers_pattern": "FL", "p_storage_error": 0.1}, "p_storage_error needs"),
        ({"p_storage_error": 0.1, "hicache": L3.hicache}, "p_storage_error needs"),
        (
            {"layers_pattern": "FL", "page_size": 4, "checkpoint": CheckpointPolicy(True, 6)},
            "every",
        ),
    ],
)
def test_bad_hybrid_settings_are_refused(changes: dict[str, Any], words: str) -> None:
    with pytest.raises((TypeError, ValueError), match=words):
        StressConfig(**changes)


@pytest.mark.parametrize(
    ("args", "words"),
    [(("disk",), "backend must be"), (("file",), "root must be"), (("memory", "/x"), "root must")],
)
def test_bad_storage_tiers_are_refused(args: tuple[str, ...], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        storage_tier(*args)


def test_the_cli_runs_a_hybrid_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--ops", "60", "--layers-pattern", "FSL", "--checkpoint", "finish+branch"]
    assert main([*argv, "--page-sizes", "4", "--only", "mla/direct/layer_first"]) == 0
    assert "FSL/mla/direct/layer_first/p4" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--layers-pattern", "FSL", "--checkpoint", "sometimes"])


# ---- planted bugs ------------------------------------------------------------------------------


class Once:
    """True on the ``at``-th call of ``fire()`` only."""

    def __init__(self, at: int) -> None:
        self.at, self.calls = at, 0

    def fire(self) -> bool:
        self.calls += 1
        return self.calls == self.at


def _caught(cfg: StressConfig, words: tuple[str, ...]) -> None:
    report = run(cfg)
    text = "\n".join(report.violations)
    assert report.violations, "the planted bug went unnoticed"
    assert any(w in text for w in words), text


def test_a_corrupted_checkpoint_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    once, copy = Once(3), MambaPool.copy_from

    def corrupting(self: MambaPool, src: torch.Tensor, dst: torch.Tensor) -> None:
        copy(self, src, dst)
        if once.fire():
            self.mamba_cache.temporal[:, dst] += 1

    monkeypatch.setattr(MambaPool, "copy_from", corrupting)
    _caught(SCENARIOS[0], ("state",))
    assert once.calls >= 3


def test_a_state_not_tracked_in_decode_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Page 8 with linear layers: a turn's end checkpoint comes from the state tracked at its
    last page boundary; a tracking copy that does nothing leaves a stale state there."""
    monkeypatch.setattr(engine_hybrid, "track_states", lambda *args: None)
    _caught(SCENARIOS[3], ("state",))


def test_a_host_state_not_loaded_back_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    once, load = Once(1), MambaPoolHost.load_to_device

    def skipping(self: MambaPoolHost, *args: Any, **kwargs: Any) -> Any:
        return None if once.fire() else load(self, *args, **kwargs)

    monkeypatch.setattr(MambaPoolHost, "load_to_device", skipping)
    _caught(SCENARIOS[0].with_(ops=600), ("state",))
    assert once.calls >= 1


def test_a_window_freed_but_not_tombstoned_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    once, tombstone = Once(2), ComponentLedger.tombstone

    def unmarked(self: ComponentLedger, node: Any) -> int:
        freed = tombstone(self, node)
        if once.fire():
            node.comp.swa_tombstoned = False  # its SWA KV is gone, the tree serves it
            self.swa_tombstoned_tokens -= len(node.key)
        return freed

    monkeypatch.setattr(ComponentLedger, "tombstone", unmarked)
    _caught(SCENARIOS[0], ("SWA",))
    assert once.calls >= 2


def test_a_state_corrupted_on_its_way_from_storage_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    once, place = Once(1), StateStorage.place

    def corrupting(self: StateStorage, node: Any, slot: int) -> None:
        if node is not None and once.fire():
            host = self.components.host_states
            data = host.page_bytes(slot).clone()
            data[0] ^= 0xFF
            host.load_bytes(slot, data)
        place(self, node, slot)

    monkeypatch.setattr(StateStorage, "place", corrupting)
    _caught(STORAGE[0].with_(ops=800), ("state",))
    assert once.calls >= 1
