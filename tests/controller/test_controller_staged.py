"""Kernel-backend backups through the controller's staging buffer (CPU stands in for CUDA):
a write whose host runs suit the copy engines is staged, one that does not runs the plain
kernel, and either way the bytes survive the round trip."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import backup_staging
from hicache.pools.backup_staging import BackupStaging
from tests.controller.helpers import assert_same_bytes, fill_random, make_rig, poison, read_bytes
from tests.pools.helpers import DEVICES


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize(("layout", "page_size"), [("layer_first", 1), ("page_first", 4)])
@pytest.mark.parametrize("long_runs", [True, False])
def test_a_write_is_staged_when_its_host_runs_suit(
    monkeypatch: pytest.MonkeyPatch,
    device: str,
    kind: str,
    layout: str,
    page_size: int,
    long_runs: bool,
) -> None:
    rig = make_rig(kind, "kernel", layout, page_size, pages=64 // page_size, device=device)
    ctrl, host_pool = rig.controller, rig.host_pool
    ctrl.staging = BackupStaging(host_pool, 3 * page_size)  # several chunks per write
    staged: list[int] = []
    real = ctrl.staging.backup
    monkeypatch.setattr(ctrl.staging, "backup", lambda *a: staged.append(a[2].numel()) or real(*a))
    unit = host_pool.item_size if layout == "layer_first" else host_pool.layout_dim
    monkeypatch.setattr(backup_staging, "ENGINE_MIN_RUN_BYTES", (32 if long_runs else 64) * unit)
    slots = rig.allocator.alloc(32)
    order = torch.randperm(32, generator=torch.Generator().manual_seed(1))
    slots = slots[order.to(device)]  # scattered
    fill_random(rig.device_pool, slots, seed=2)
    want = read_bytes(rig.device_pool, slots)
    host = ctrl.write(slots, node_id=1)
    assert host is not None and bool((host[1:] == host[:-1] + 1).all())  # one host run
    ctrl.start_writing()
    assert staged == ([32] if long_runs else [])
    ctrl.drain()  # landed before the slots are freed and poisoned
    ctrl.evict_device(slots)
    poison(rig.device_pool)
    loaded = ctrl.load(host, node_id=2)
    ctrl.layer_done_counter.set_consumer(ctrl.start_loading())
    assert_same_bytes(read_bytes(rig.device_pool, loaded), want)
