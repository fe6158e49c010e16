"""Page integrity (``verify="all"``) of a hybrid model's host tier through the real controller:
clean round trips pass, a flipped host byte in a full or an SWA layer of a live page is caught
at its page, and a page with a tombstoned token (SWA slot 0) never fails on its SWA layers."""

from __future__ import annotations

import pytest
import torch

from hicache.kernels.checksum import NO_SUM
from tests.controller.hybrid_rig import all_layer_bytes, backed_up, fill_random, make_hybrid_rig
from tests.pools.helpers import DEVICES


def load_verified(rig, host: torch.Tensor, tombstone: int = 0) -> tuple[torch.Tensor, int | None]:
    """Queue the load of ``host`` (freeing the SWA slots of its first ``tombstone`` tokens
    before it is issued), issue it and verify it: (its device slots, first bad offset)."""
    ctrl = rig.controller
    slots = ctrl.load(host, node_id=2)
    assert slots is not None
    if tombstone:
        rig.allocator.free_swa(slots[:tombstone])
    ctrl.start_loading()
    return slots, ctrl.verify_load(host, slots)


def flip_host_byte(rig, inner: int, layer: int, slot: int) -> None:
    """Flip one byte of host ``slot`` in layer ``layer`` of inner host pool ``inner``."""
    buf = rig.host.host_pools[inner].kv_buffer  # layer_first: [parts,] layers, slots, ...
    rows = buf[-1][layer] if buf.dim() == 5 else buf[layer]
    rows[slot].view(torch.uint8).view(-1)[3] ^= 0x20


@pytest.mark.parametrize(
    ("pattern", "kind", "page_size"),
    [("FSFS", "mha", 1), ("FSFS", "mha", 4), ("SFFS", "mla", 1), ("FSFS", "mla", 4)]
    + [("LFLF", "mha", 4), ("FLLF", "mla", 1)],
)
@pytest.mark.parametrize("device", DEVICES)
def test_a_clean_round_trip_passes_verification(device, pattern, kind, page_size):
    rig = make_hybrid_rig(pattern, kind, page_size=page_size, device=device, verify="all")
    host, want = backed_up(rig, 3 * page_size)
    sums = rig.controller.integrity.store[host[::page_size] // page_size]
    assert bool((sums[:, : len(rig.kv.layers_mapping)] > 0).all())  # one column a KV layer
    slots, bad = load_verified(rig, host)
    assert bad is None and rig.controller.integrity.failures == 0
    assert all(torch.equal(all_layer_bytes(rig.kv, slots)[g], want[g]) for g in want)


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("inner", [0, 1])  # the full pool's layers, the SWA pool's
@pytest.mark.parametrize("device", DEVICES)
def test_a_flipped_host_byte_is_caught_at_its_page(device, kind, page_size, inner):
    rig = make_hybrid_rig("FSFS", kind, page_size=page_size, device=device, verify="all")
    host, _ = backed_up(rig, 3 * page_size)
    flip_host_byte(rig, inner, 1, int(host[page_size + page_size // 2]))
    _, bad = load_verified(rig, host)
    assert bad == page_size and rig.controller.integrity.failures == 1


@pytest.mark.parametrize("device", DEVICES)
def test_a_page_tombstoned_at_backup_has_no_swa_checksum_and_never_fails(device):
    rig = make_hybrid_rig("FSFS", page_size=4, device=device, verify="all")
    ctrl, store = rig.controller, rig.controller.integrity.store
    slots = rig.allocator.alloc(8)
    fill_random(rig.kv, slots, seed=3)
    rig.allocator.free_swa(slots[1:2])  # one token of page 0 left every window
    host = ctrl.write(slots, node_id=1)
    ctrl.drain()
    rows = host[::4] // 4
    assert store[rows[0], 2:].tolist() == [NO_SUM] * 2  # the SWA layers' block
    assert bool((store[rows[0], :2] != NO_SUM).all() and (store[rows[1]] != NO_SUM).all())
    ctrl.evict_device(slots)
    for part in rig.kv.swa_kv_pool.part_buffers:  # pad slot 0 changes: no page's bytes
        for layer in part:
            layer[0] = -layer[0] - 1
    flip_host_byte(rig, 1, 0, int(host[0]))  # page 0's SWA bytes are pad garbage
    _, bad = load_verified(rig, host)
    assert bad is None and ctrl.integrity.failures == 0
    flip_host_byte(rig, 0, 0, int(host[0]))  # its full layers are checked
    _, bad = load_verified(rig, host)
    assert bad == 0 and ctrl.integrity.failures == 1


@pytest.mark.parametrize("device", DEVICES)
def test_a_token_tombstoned_before_its_load_skips_that_pages_swa_check_only(device):
    rig = make_hybrid_rig("FSFS", page_size=4, device=device, verify="all")
    host, _ = backed_up(rig, 8)
    _, bad = load_verified(rig, host, tombstone=4)  # page 0's SWA KV lands in pad slot 0
    assert bad is None and rig.controller.integrity.failures == 0
    flip_host_byte(rig, 1, 1, int(host[5]))  # a live page's SWA layer
    slots, bad = load_verified(rig, host, tombstone=4)
    assert bad == 4 and rig.controller.integrity.failures == 1
    assert slots.numel() == 8
