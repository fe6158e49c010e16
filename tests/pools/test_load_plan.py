"""HostKVPool.plan_load: a load planned once and run per layer, against the per-layer route and a
plain-torch oracle, byte-exact, for every (parts, layout, io_backend) route."""

from __future__ import annotations

import pytest
import torch

import hicache.kernels.validate as kernel_checks
import hicache.pools.host_pool as host_pool_module
from hicache import env
from hicache.kernels.dispatch import force_backend
from hicache.pools import KVPool
from hicache.pools.host_pool import HostKVPool
from tests.pools.helpers import DEVICES, POISON, as_bytes, fill_random, poison
from tests.pools.test_host_transfer import KINDS, PAIRS, host_index, scattered_pages

LAYERS = 4


def rig(kind: str, layout: str, page_size: int, device: str = "cpu") -> tuple[KVPool, HostKVPool]:
    """A device pool of 4 pages and its host pool of 8, host bytes random, device poisoned."""
    make_device, make_host = KINDS[kind]
    dev = make_device(size=4 * page_size, page_size=page_size, device=device, layers=LAYERS)
    host = make_host(dev, 2.0, 0, page_size, layout)
    fill_random([host.kv_buffer], seed=page_size)
    for layer in (layer for part in dev.part_buffers for layer in part):
        poison(layer)
    return dev, host


def slots(page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """3 scattered host pages and 3 scattered device pages (never slot 0's page)."""
    host = scattered_pages(8, 0, 3, page_size, seed=3)
    return host, scattered_pages(4, 1, 3, page_size, seed=4)


def device_bytes(dev: KVPool) -> list[list[torch.Tensor]]:
    return [[as_bytes(layer).cpu().clone() for layer in part] for part in dev.part_buffers]


def same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> bool:
    """Every part of every layer byte-identical."""
    pairs = [(x, y) for pa, pb in zip(a, b, strict=True) for x, y in zip(pa, pb, strict=True)]
    return all(torch.equal(x, y) for x, y in pairs)


def expected(host: HostKVPool, h: torch.Tensor, d: torch.Tensor) -> list[list[torch.Tensor]]:
    """The oracle: poison everywhere but ``d``, which holds host slots ``h`` of each layer."""
    out = []
    for part in host.host_parts:
        layers = []
        for layer in range(host.layer_num):
            rows = as_bytes(part)[host_index(host, layer, h)]
            want = torch.full((host.device_pool.num_slots, *rows.shape[1:]), POISON).to(rows)
            want[d] = rows
            layers.append(want)
        out.append(layers)
    return out


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize(("kind", "layout", "backend"), PAIRS)
def test_plan_matches_per_layer_route_and_oracle(
    kind: str, layout: str, backend: str, page_size: int
) -> None:
    dev, host = rig(kind, layout, page_size)
    per_layer, _ = rig(kind, layout, page_size)
    h, d = slots(page_size)
    plan = host.plan_load(dev, h, d, backend)
    assert plan.num_layers == LAYERS
    for layer in range(LAYERS):
        plan.run(layer)
        host.load_to_device_per_layer(per_layer, h, d, layer, backend)
    oracle = expected(host, h, d)
    assert same(device_bytes(dev), oracle), "plan"
    assert same(device_bytes(per_layer), oracle), "per-layer route"


@pytest.mark.skipif(
    torch.cuda.is_available() or not env.ENV.triton_interpret,
    reason="the Triton interpreter runs on CPU-only machines (TRITON_INTERPRET=1)",
)
@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_head"])
def test_plan_on_the_triton_kernel(layout: str) -> None:
    """The kernel route's plan through the Triton kernel (the interpreter on CPU)."""
    dev, host = rig("mha", layout, 4)
    h, d = slots(4)
    with force_backend("triton"):
        plan = host.plan_load(dev, h, d, "kernel")
        for layer in range(LAYERS):
            plan.run(layer)
    assert same(device_bytes(dev), expected(host, h, d))


@pytest.mark.parametrize(("kind", "layout", "backend"), PAIRS)
def test_plan_refuses_a_bad_layer_id(kind: str, layout: str, backend: str) -> None:
    dev, host = rig(kind, layout, 4)
    h, d = slots(4)
    plan = host.plan_load(dev, h, d, backend)
    before = device_bytes(dev)
    for bad, error in ((LAYERS, ValueError), (-1, ValueError), (True, TypeError), (1.0, TypeError)):
        with pytest.raises(error, match="layer_id"):
            plan.run(bad)
    assert same(device_bytes(dev), before)
    host.close()
    with pytest.raises(RuntimeError, match="closed"):
        plan.run(0)


@pytest.mark.parametrize(("kind", "layout", "backend"), PAIRS)
def test_bad_input_raises_at_plan_time(kind: str, layout: str, backend: str) -> None:
    dev, host = rig(kind, layout, 4)
    h, d = slots(4)
    out_of_range = h.clone()
    out_of_range[0] = host.size
    with pytest.raises(IndexError, match="host_indices"):
        host.plan_load(dev, out_of_range, d, backend)
    with pytest.raises(TypeError, match="device_indices"):
        host.plan_load(dev, h, d.int(), backend)
    with pytest.raises(ValueError, match="equally long"):
        host.plan_load(dev, h, d[:4], backend)
    with pytest.raises(ValueError, match="io_backend"):
        host.plan_load(dev, h, d, "dma")
    assert all((as_bytes(layer) == POISON).all() for part in dev.part_buffers for layer in part)


@pytest.mark.parametrize(("kind", "layout", "backend"), PAIRS)
def test_layers_run_without_validating_again(
    kind: str, layout: str, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every index check runs while planning; running the layers runs none of them."""
    calls: list[str] = []
    for module, name in (
        (host_pool_module, "check_slot_indices"),
        (kernel_checks, "check_index_tensor"),
        (kernel_checks, "check_index_range"),
        (kernel_checks, "check_data"),
    ):
        original = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k)
        )
    dev, host = rig(kind, layout, 4)
    h, d = slots(4)
    plan = host.plan_load(dev, h, d, backend)
    planned = list(calls)
    assert "check_slot_indices" in planned and "check_index_range" in planned
    for layer in range(LAYERS):
        plan.run(layer)
    assert calls == planned


cuda_only = pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA")


@cuda_only
@pytest.mark.parametrize(("kind", "layout", "backend"), PAIRS)
def test_cuda_plan_matches_per_layer_route(kind: str, layout: str, backend: str) -> None:
    dev, host = rig(kind, layout, 16, "cuda")
    per_layer, _ = rig(kind, layout, 16, "cuda")
    h, d = slots(16)
    plan = host.plan_load(dev, h, d.cuda(), backend)
    for layer in range(LAYERS):
        plan.run(layer)
        host.load_to_device_per_layer(per_layer, h, d.cuda(), layer, backend)
    torch.cuda.synchronize()
    assert same(device_bytes(dev), device_bytes(per_layer))
