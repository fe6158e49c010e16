"""PageGeometry: one frozen value owned by the device pool, read by the host pool, the
controller and the storage keys, compared where pools are paired."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hicache.backends import StorageConfig
from hicache.pools.geometry import PageGeometry
from hicache.tiers.storage.storage_build import fingerprint_of
from tests.controller.helpers import make_rig
from tests.pools.helpers import mha_pool, mla_pool


@pytest.mark.parametrize("make", [mha_pool, mla_pool])
def test_the_device_pool_owns_one_frozen_geometry(make) -> None:
    pool = make(page_size=4, layers=3)
    g = pool.geometry
    assert isinstance(g, PageGeometry) and pool.geometry is g
    assert (g.page_size, g.layer_num, g.item_size, g.kind) == (4, 3, pool.item_size, pool.kind)
    assert g.parts == len(pool.part_buffers)
    assert g.row_shape == tuple(pool.part_buffers[0][0].shape[1:])
    assert g.page_bytes == 4 * 3 * pool.item_size
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.page_size = 8  # type: ignore[misc]


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_host_pool_controller_and_storage_keys_read_it(kind: str) -> None:
    rig = make_rig(kind, page_size=4, pages=4)
    g = rig.device_pool.geometry
    assert rig.host_pool.geometry is g and rig.controller.geometry is g
    assert (rig.host_pool.page_size, rig.host_pool.layer_num) == (g.page_size, g.layer_num)
    assert (rig.host_pool.head_num, rig.host_pool.head_dim) == g.row_shape
    fp = fingerprint_of(rig.host_pool, StorageConfig(backend="memory"))
    assert (fp.page_size, fp.layer_num, (fp.head_num, fp.head_dim)) == (
        g.page_size,
        g.layer_num,
        g.row_shape,
    )
    assert fp.is_mla == (g.parts == 1) and fp.layout == rig.host_pool.layout


def test_mismatch_names_each_differing_field() -> None:
    a = mha_pool(page_size=4).geometry
    assert a.mismatch(mha_pool(page_size=4).geometry) == []
    b = mha_pool(page_size=8, dtype=torch.bfloat16).geometry
    assert a.mismatch(b) == [
        "dtype: host pool torch.float16, device pool torch.bfloat16",
        "page_size: host pool 4, device pool 8",
    ]
    assert a.mismatch({"kind": "object"})[0] == "kind: host pool MHA, device pool object"
