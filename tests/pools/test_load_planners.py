"""HostKVPool.plan_load validates the layer buffers of a device pool once, not every batch, and
again when that pool's layer buffers are other tensors; its planners never keep a pool alive."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import hicache.kernels.validate as kernel_checks
from hicache import env
from hicache.kernels.dispatch import force_backend
from tests.pools.helpers import POISON, as_bytes
from tests.pools.test_host_transfer import PAIRS
from tests.pools.test_load_plan import LAYERS, device_bytes, expected, rig, same, slots


def _count_layer_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    original = kernel_checks.check_layer_buffers
    monkeypatch.setattr(
        kernel_checks,
        "check_layer_buffers",
        lambda name, *a: calls.append(name) or original(name, *a),
    )
    return calls


@pytest.mark.parametrize(("kind", "layout", "backend"), PAIRS)
def test_layer_buffers_are_validated_once_per_device_pool(
    kind: str, layout: str, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_layer_checks(monkeypatch)
    dev, host = rig(kind, layout, 4)
    h, d = slots(4)
    host.plan_load(dev, h, d, backend)
    assert "dst_layers" in calls
    first = len(calls)
    h2, d2 = h.flip(0), d.roll(4)  # another batch: other pairs, same slots
    plan = host.plan_load(dev, h2, d2, backend)
    assert len(calls) == first
    for layer in range(LAYERS):
        plan.run(layer)
    assert same(device_bytes(dev), expected(host, h2, d2))
    other, _ = rig(kind, layout, 4)  # another device pool of the same geometry
    host.plan_load(other, h, d, backend)
    assert len(calls) == 2 * first


@pytest.mark.parametrize(("kind", "layout", "backend"), PAIRS)
def test_a_replaced_layer_buffer_is_validated_again(kind: str, layout: str, backend: str) -> None:
    dev, host = rig(kind, layout, 4)
    h, d = slots(4)
    host.plan_load(dev, h, d, backend)
    part = dev.part_buffers[0]
    part[1] = part[1][: part[1].shape[0] // 2]  # half the slots: unlike layer 0
    with pytest.raises(ValueError, match=r"dst_layers\[1\]"):
        host.plan_load(dev, h, d, backend)
    assert all((as_bytes(layer) == POISON).all() for p in dev.part_buffers for layer in p)


@pytest.mark.parametrize("backend", ["kernel", "direct"])
def test_planners_do_not_keep_a_device_pool_alive(backend: str) -> None:
    dev, host = rig("mha", "layer_first", 4)
    other, its_host = rig("mha", "layer_first", 4)
    h, d = slots(4)
    host.plan_load(other, h, d, backend)
    gone = weakref.ref(other)
    del other, its_host
    gc.collect()
    assert gone() is None
    assert isinstance(host.plan_load(dev, h, d, backend).device_indices, torch.Tensor)


@pytest.mark.skipif(
    torch.cuda.is_available() or not env.ENV.triton_interpret,
    reason="the Triton interpreter runs on CPU-only machines (TRITON_INTERPRET=1)",
)
@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_head"])
def test_later_batches_reuse_the_launch_with_their_own_indices(layout: str) -> None:
    """Through the Triton kernel (the interpreter on CPU), a second and a shorter third batch,
    launched with the first batch's prepared launch, each land their own slots."""
    dev, host = rig("mha", layout, 4)
    h, d = slots(4)
    with force_backend("triton"):
        for hb, db in ((h, d), (h.flip(0), d.roll(4)), (h[:4], d[4:8])):
            plan = host.plan_load(dev, hb, db, "kernel")
            for layer in range(LAYERS):
                plan.run(layer)
            want = expected(host, hb, db)
            got = device_bytes(dev)
            assert all(
                torch.equal(g[db], w[db]) for gp, wp in zip(got, want, strict=True)
                for g, w in zip(gp, wp, strict=True)
            )  # fmt: skip
