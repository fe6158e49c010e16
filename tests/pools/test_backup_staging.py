"""Staged backups (``hicache.pools.backup_staging``): every kernel layout, MHA and MLA, pages 1
and 4, batches of several chunks with a partial last one; the host slots hold exactly the
device slots' bytes and nothing else is written. Then which batches are staged, and when a
controller stages at all."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache import env
from hicache.pools import SUPPORTED_PAIRS, backup_staging
from hicache.pools.backup_staging import BackupStaging, controller_staging
from tests.pools.helpers import DEVICES, POISON, as_bytes, fill_random, poison
from tests.pools.test_host_transfer import KINDS, check_backup, scattered_pages

CASES = [
    (kind, layout)
    for kind in KINDS
    for layout in SUPPORTED_PAIRS["kernel"]
    if not (kind == "mla" and layout == "page_head")
]


def _rig(kind: str, layout: str, page: int, device_pages: int = 8, device: str = "cpu"):
    make_device, make_host = KINDS[kind]
    dev = make_device(size=device_pages * page, page_size=page, dtype=torch.bfloat16, device=device)
    fill_random([layer for part in dev.part_buffers for layer in part], seed=page)
    original = [[as_bytes(layer).cpu().clone() for layer in part] for part in dev.part_buffers]
    return dev, make_host(dev, 2.0, 0, page, layout), original


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("kind", "layout"), CASES)
@pytest.mark.parametrize(("page", "staged_pages", "pages"), [(1, 2, 5), (4, 2, 6), (4, 3, 7)])
def test_a_staged_backup_writes_exactly_the_batch(
    device: str, kind: str, layout: str, page: int, staged_pages: int, pages: int
) -> None:
    dev, host, original = _rig(kind, layout, page, device=device)
    src = scattered_pages(8, 1, pages, page, seed=3)  # scattered device pages
    h = scattered_pages(16, 0, pages, page, seed=4)  # host pages in any order, runs or not
    staging = BackupStaging(host, staged_pages * page + page - 1, block_quota=1)
    assert staging.size == staged_pages * page  # whole pages
    poison(host.kv_buffer)
    staging.backup(host, dev, h, src.to(device))
    if device == "cuda":
        torch.cuda.synchronize()  # the CPU reads what the engines wrote
    check_backup(host, original, src, h)  # every layer of every part, and nothing else


@pytest.mark.parametrize(("kind", "layout"), CASES)
def test_the_host_pool_stages_kernel_backups_that_suit(
    kind: str, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev, host, original = _rig(kind, layout, 4)
    staging = BackupStaging(host, 8)
    calls: list[int] = []
    real = staging.backup
    monkeypatch.setattr(staging, "backup", lambda *a: calls.append(a[2].numel()) or real(*a))
    src, runs = scattered_pages(8, 1, 3, 4, seed=5), torch.arange(8, 20)
    unit = host.item_size if layout == "layer_first" else host.layout_dim
    monkeypatch.setattr(backup_staging, "ENGINE_MIN_RUN_BYTES", 12 * unit)  # one run of 12
    for h, backend, staged in [
        (runs, "kernel", True),
        (runs, "auto", True),  # page_first/page_head: auto is the kernel; layer_first page 4 too
        (torch.cat([runs[8:], runs[:8]]), "kernel", False),  # two runs: too short
    ]:
        poison(host.kv_buffer)
        calls.clear()
        host.backup_from_device_all_layer(dev, h, src, backend, staging)
        check_backup(host, original, src, h)
        assert calls == ([12] if staged else []), (backend, h)


def test_suits_counts_host_runs_in_bytes_and_never_reads_cuda_indices() -> None:
    _, host, _ = _rig("mha", "layer_first", 1)
    staging = BackupStaging(host, 4)
    need = -(-backup_staging.ENGINE_MIN_RUN_BYTES // host.item_size)  # slots per run
    assert staging.suits(torch.arange(need))
    assert not staging.suits(torch.arange(need - 1))
    assert not staging.suits(torch.arange(0, 2 * need, 2))  # every slot its own run
    if torch.cuda.is_available():
        assert not staging.suits(torch.arange(need).cuda())


def test_construction_is_checked() -> None:
    _, host, _ = _rig("mha", "layer_first", 4)
    with pytest.raises(ValueError, match="slots"):
        BackupStaging(host, 3)
    with pytest.raises(TypeError, match="slots"):
        BackupStaging(host, 8.0)
    with pytest.raises(ValueError, match="block_quota"):
        BackupStaging(host, 8, block_quota=0)
    dev, make_host = KINDS["mha"][0](size=16, page_size=4), KINDS["mha"][1]
    with pytest.raises(ValueError, match="page_first_direct"):
        BackupStaging(make_host(dev, 2.0, 0, 4, "page_first_direct"), 8)


def test_a_controller_stages_only_pinned_cuda_kernel_capable_pools(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _, host, _ = _rig("mha", "layer_first", 4)
    monkeypatch.setattr(env, "ENV", dataclasses.replace(env.ENV, backup_staging_mb=0.0))
    monkeypatch.setattr(host, "pinned", True)  # as on CUDA
    assert controller_staging(host, "auto") is None  # HICACHE_BACKUP_STAGING_MB=0: off
    monkeypatch.setattr(env, "ENV", dataclasses.replace(env.ENV, backup_staging_mb=256.0))
    with caplog.at_level("INFO", logger="hicache.pools.backup_staging"):
        staging = controller_staging(host, "kernel")
    assert staging is not None and staging.size == host.device_pool.size  # capped: 32 slots
    assert staging.nbytes == 2 * 32 * host.layout_dim
    assert "backup staging: 32 slots" in caplog.text  # the device memory it takes is logged
    assert controller_staging(host, "direct") is None
    monkeypatch.setattr(host, "pinned", False)
    assert controller_staging(host, "kernel") is None  # CPU (or unpinned): nothing to spare


def test_the_staging_setting_is_read_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HICACHE_BACKUP_STAGING_MB", raising=False)
    monkeypatch.setattr(env, "ENV", env.Env.read())
    assert env.backup_staging_bytes() == 256 * 2**20  # on by default
    monkeypatch.setenv("HICACHE_BACKUP_STAGING_MB", "0")
    monkeypatch.setattr(env, "ENV", env.Env.read())
    assert env.backup_staging_bytes() == 0
    monkeypatch.setenv("HICACHE_BACKUP_STAGING_MB", "1.5")
    monkeypatch.setattr(env, "ENV", env.Env.read())
    assert env.backup_staging_bytes() == 3 * 2**19
    monkeypatch.setenv("HICACHE_BACKUP_STAGING_MB", "-1")
    monkeypatch.setattr(env, "ENV", env.Env.read())
    with pytest.raises(ValueError, match="HICACHE_BACKUP_STAGING_MB"):
        env.backup_staging_bytes()


def test_a_foreign_staging_buffer_is_refused_before_anything_moves() -> None:
    dev, host, _ = _rig("mha", "layer_first", 4)
    _, other, _ = _rig("mha", "page_first", 4)  # same geometry, another layout
    src, h = scattered_pages(8, 1, 2, 4, seed=6), torch.arange(8)
    poison(host.kv_buffer)
    with pytest.raises(TypeError, match="staging"):
        host.backup_from_device_all_layer(dev, h, src, "kernel", staging=object())
    with pytest.raises(ValueError, match="staging"):
        host.backup_from_device_all_layer(dev, h, src, "kernel", staging=BackupStaging(other, 8))
    assert (as_bytes(host.kv_buffer) == POISON).all()  # nothing written


@settings(max_examples=25, deadline=None)
@given(
    case=st.sampled_from(CASES),
    page=st.sampled_from([1, 2, 4]),
    data=st.data(),
)
def test_any_batch_and_buffer_size_back_up_exactly(case, page: int, data) -> None:
    """Random device and host pages (runs, reversed runs, gaps), any buffer of whole pages."""
    kind, layout = case
    dev, host, original = _rig(kind, layout, page, device_pages=12)
    pages = data.draw(st.integers(1, 12), label="pages")
    src_pages = data.draw(st.permutations(range(1, 13)), label="device pages")[:pages]
    host_pages = data.draw(st.permutations(range(host.size // page)), label="host pages")[:pages]
    if data.draw(st.booleans(), label="host pages sorted"):
        host_pages = sorted(host_pages)
    staged = data.draw(st.integers(1, pages + 1), label="buffer pages")

    def slots(ps: list[int]) -> torch.Tensor:
        return (torch.tensor(ps)[:, None] * page + torch.arange(page)).flatten()

    src, h = slots(src_pages), slots(host_pages)
    poison(host.kv_buffer)
    BackupStaging(host, staged * page, block_quota=2).backup(host, dev, h, src)
    check_backup(host, original, src, h)
