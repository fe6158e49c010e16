"""io_backend="auto" through the controller (CPU): each batch takes the backend its runs call
for, and the bytes survive the round trip either way."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import auto_backend
from tests.controller.helpers import assert_same_bytes, fill_random, make_rig, poison, read_bytes


@pytest.fixture()
def small_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scale the thresholds to the tiny test pools (64-byte MHA, 24-byte MLA slots): a 64-slot
    run is long, a single slot short, and a batch of 128 slots big enough."""
    monkeypatch.setattr(auto_backend, "ENGINE_MIN_RUN_BYTES", 64 * 24)
    monkeypatch.setattr(auto_backend, "ENGINE_MIN_BATCH_BYTES", 64 * 24)


def _spy(monkeypatch: pytest.MonkeyPatch, host_pool, name: str, seen: list[str]) -> None:
    original = getattr(host_pool, name)

    def spy(*args, **kwargs):
        seen.append(args[-1])
        return original(*args, **kwargs)

    monkeypatch.setattr(host_pool, name, spy)


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize(
    ("page_size", "expected"),
    [
        (64, ["direct", "direct"]),  # whole pages: long runs both ways
        # scattered device slots: the write's runs are single slots; the load gets fresh
        # consecutive device slots for the consecutive host slots the write took: one run
        (1, ["kernel", "direct"]),
    ],
)
def test_auto_picks_per_batch_and_round_trips(
    monkeypatch, small_thresholds, kind: str, page_size: int, expected: list[str]
) -> None:
    rig = make_rig(kind, "auto", "layer_first", page_size, pages=256 // page_size)
    seen: list[str] = []
    for name in ("backup_from_device_all_layer", "plan_load"):
        _spy(monkeypatch, rig.host_pool, name, seen)
    ctrl = rig.controller
    slots = rig.allocator.alloc(128)
    if page_size == 1:  # scattered single slots
        slots = slots[torch.randperm(128, generator=torch.Generator().manual_seed(0))]
    fill_random(rig.device_pool, slots, seed=3)
    want = read_bytes(rig.device_pool, slots)
    host = ctrl.write(slots, node_id=1)
    ctrl.start_writing()
    ctrl.evict_device(slots)
    poison(rig.device_pool)
    loaded = ctrl.load(host, node_id=2)
    ctrl.layer_done_counter.set_consumer(ctrl.start_loading())
    assert_same_bytes(read_bytes(rig.device_pool, loaded), want)
    assert seen == expected


def test_auto_small_batch_stays_on_the_kernel(monkeypatch) -> None:
    """Default thresholds: a tiny batch with page-long runs is under the 4 MiB floor."""
    rig = make_rig("mha", "auto", "layer_first", 64, pages=4)
    seen: list[str] = []
    _spy(monkeypatch, rig.host_pool, "plan_load", seen)
    host = rig.controller.write(rig.allocator.alloc(128), node_id=1)
    rig.controller.start_writing()
    rig.controller.load(host, node_id=2)
    rig.controller.start_loading()
    assert seen == ["kernel"]
