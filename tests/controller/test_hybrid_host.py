"""A composite device pool's KV through the real HiCacheController and a HybridKVPoolHost:
round trips, tombstoned SWA tokens (pad slot 0 only), per-layer readiness on global layers."""

from __future__ import annotations

import pytest
import torch

from hicache.pools import ROUTES, HybridLinearKVPool, SWAKVPool
from tests.controller.hybrid_rig import (
    all_layer_bytes,
    backed_up,
    fill_random,
    landed,
    make_hybrid_rig,
    poison,
)
from tests.pools.helpers import DEVICES


def load_back(rig, host: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Poison the device pools, queue and issue the load of ``host``: (new slots, producer)."""
    poison(rig.kv)
    slots = rig.controller.load(host, node_id=2)
    assert slots is not None
    return slots, rig.controller.start_loading()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("kind", "io_backend", "layout"), ROUTES)
@pytest.mark.parametrize("page_size", [1, 4])
def test_swa_kv_round_trips_through_the_host_pool(device, kind, io_backend, layout, page_size):
    rig = make_hybrid_rig("FSSFS", kind, io_backend, layout, page_size, device=device)
    assert isinstance(rig.kv, SWAKVPool) and rig.kv.size_swa < rig.kv.size
    host, want = backed_up(rig, 3 * page_size)
    slots, _ = load_back(rig, host)
    rig.controller.drain()
    assert landed(rig.kv, want, slots) == sorted(want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("pattern", ["LFLF", "FLLF"])
def test_hybrid_linear_kv_round_trips_and_counts_linear_layers(device, kind, pattern):
    rig = make_hybrid_rig(pattern, kind, page_size=4, device=device)
    assert isinstance(rig.kv, HybridLinearKVPool)
    assert rig.controller.layer_done_counter.num_layers == len(pattern)  # L layers counted
    host, want = backed_up(rig, 8)
    slots, producer = load_back(rig, host)
    rig.controller.layer_done_counter.set_consumer(producer)
    rig.kv.get_key_buffer(max(want))  # the last attention layer's wait
    if device == "cuda":
        torch.cuda.synchronize()
    assert landed(rig.kv, want, slots) == sorted(want)


def swa_rows(kv) -> list[torch.Tensor]:
    """The SWA pool's layer buffers (every part), raw bytes ``[slots, heads, row bytes]``."""
    return [layer.view(torch.uint8) for part in kv.swa_kv_pool.part_buffers for layer in part]


def swa_host_rows(rig) -> list[torch.Tensor]:
    """The SWA inner host pool's (layer_first) layers in :func:`swa_rows`' order, raw bytes."""
    buf = rig.host.host_pools[1].kv_buffer.view(torch.uint8)  # [parts, layers, slots, H, D]
    return [buf[part, layer] for part in range(buf.shape[0]) for layer in range(buf.shape[1])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("io_backend", "page_size"), [("kernel", 1), ("kernel", 4), ("direct", 4)])
def test_a_tombstoned_token_is_backed_up_from_pad_slot_0(device, io_backend, page_size):
    rig = make_hybrid_rig("FSFS", "mha", io_backend, "layer_first", page_size, device=device)
    slots = rig.allocator.alloc(2 * page_size)
    fill_random(rig.kv, slots, seed=5)
    live = rig.kv.inner_slots(slots)[1][page_size:].cpu()
    rig.allocator.free_swa(slots[:page_size])  # the first page left every window
    gen = torch.Generator().manual_seed(6)
    for raw in swa_rows(rig.kv):  # the pad slot holds random bytes too
        raw[0] = torch.randint(0, 256, raw[0].shape, generator=gen, dtype=torch.uint8).to(device)
    for raw in swa_host_rows(rig):
        raw.fill_(0x5A)
    host = rig.controller.write(slots, node_id=1)
    rig.controller.drain()
    others = torch.ones(rig.host.size, dtype=torch.bool)
    others[host] = False
    for dev, got in zip([r.cpu() for r in swa_rows(rig.kv)], swa_host_rows(rig), strict=True):
        assert all(torch.equal(got[h], dev[0]) for h in host[:page_size].tolist())
        assert torch.equal(got[host[page_size:]], dev[live])
        assert bool((got[others] == 0x5A).all()), "a host slot outside the batch was written"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("kind", "io_backend", "layout"), ROUTES)
def test_a_token_tombstoned_before_its_load_lands_in_pad_slot_0_only(
    device, kind, io_backend, layout
):
    rig = make_hybrid_rig("FSFS", kind, io_backend, layout, page_size=4, device=device)
    host, want = backed_up(rig, 8)
    poison(rig.kv)
    slots = rig.controller.load(host, node_id=2)
    live_swa = rig.kv.inner_slots(slots)[1][4:].cpu()
    rig.allocator.free_swa(slots[:4])  # freed after the load was queued, before it was issued
    before = [raw.cpu() for raw in swa_rows(rig.kv)]
    rig.controller.start_loading()
    rig.controller.drain()
    touched = torch.zeros(before[0].shape[0], dtype=torch.bool)
    touched[live_swa] = True
    touched[0] = True
    for raw, old in zip([r.cpu() for r in swa_rows(rig.kv)], before, strict=True):
        assert torch.equal(raw[~touched], old[~touched]), "a slot besides pad 0 was written"
    full_layers = [g for g, (_, is_swa) in rig.kv.layers_mapping.items() if not is_swa]
    got = all_layer_bytes(rig.kv, slots)
    assert all(torch.equal(got[g], want[g]) for g in full_layers)
    swa_layers = [g for g in want if g not in full_layers]
    assert all(torch.equal(got[g][4:], want[g][4:]) for g in swa_layers)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("pattern", "kind"), [("FSLSF", "mha"), ("SFLSF", "mla"), ("LFLF", "mha")])
def test_a_getter_of_global_layer_i_sees_layer_i_landed_with_one_layer_ahead(device, pattern, kind):
    rig = make_hybrid_rig(pattern, kind, page_size=4, device=device, layers_ahead=1)
    host, want = backed_up(rig, 8)
    slots, producer = load_back(rig, host)
    counter = rig.controller.layer_done_counter
    assert counter.num_layers == len(pattern)
    assert set(landed(rig.kv, want, slots)) <= {0}  # layer 0 only issued
    counter.set_consumer(producer)
    for layer in sorted(want):
        rig.kv.get_key_buffer(layer)  # waits on global layer `layer`: issued through layer + 1
        got = set(landed(rig.kv, want, slots))  # read on the compute stream, after the wait
        assert {g for g in want if g <= layer} <= got <= {g for g in want if g <= layer + 1}
        if device == "cpu":  # synchronous: the layer issued ahead has landed too
            assert got == {g for g in want if g <= layer + 1}
    assert rig.controller.ack_load_queue[-1].finish_event.query()  # every layer issued
