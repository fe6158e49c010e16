"""A hybrid model's HybridHiRadixCache under seeded random stress (``layers_pattern``), with
faults, and bugs planted in its components that the hybrid oracle must find."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import hicache.engine.hybrid as engine_hybrid
from hicache.pools import MambaPool, MambaPoolHost
from hicache.radix import CheckpointPolicy
from hicache.radix.component_ledger import ComponentLedger
from hicache.stress import runner
from hicache.stress.__main__ import main
from hicache.stress.config import StressConfig
from hicache.stress.runner import matrix, run

BASE = StressConfig(ops=300, full_every=60, seed=5)
SCENARIOS = [
    BASE.with_(layers_pattern="FSL", page_size=1),
    BASE.with_(layers_pattern="FSL", page_size=8, kind="mla"),
    BASE.with_(layers_pattern="FS", page_size=1, kind="mla", eviction_policy="mru"),
    BASE.with_(layers_pattern="FL", page_size=8),
    BASE.with_(layers_pattern="FFSL", page_size=4, checkpoint=CheckpointPolicy(True, 8, True)),
]
FAULTY = [c.with_(p_alloc_none=0.1, p_transfer_fail=0.1, seed=c.seed + 1) for c in SCENARIOS[:3]]
SLOW = [
    c.with_(ops=1000, full_every=250)
    for pattern in ("FSL", "SFL", "FL")
    for c in matrix(BASE.with_(layers_pattern=pattern, seed=31), (1, 16))
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
        (
            {"layers_pattern": "FL", "page_size": 4, "checkpoint": CheckpointPolicy(True, 6)},
            "every",
        ),
    ],
)
def test_bad_hybrid_settings_are_refused(changes: dict[str, Any], words: str) -> None:
    with pytest.raises((TypeError, ValueError), match=words):
        StressConfig(**changes)


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
